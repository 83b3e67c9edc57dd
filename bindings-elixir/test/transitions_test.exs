defmodule GenDurable.TransitionsTest do
  use ExUnit.Case, async: true
  import GenDurable.TestHelper

  alias GenDurableTest.Steps

  setup do
    engine =
      start_engine(
        workflows: [Steps],
        rate_limits: [api: [limit: 1000, period: 1000, burst: 10]]
      )

    %{engine: engine, t: register()}
  end

  defp insert(engine, test, mode, opts \\ []) do
    state = Map.merge(%{"test" => test, "mode" => mode}, Keyword.get(opts, :state, %{}))
    GenDurable.insert!(Steps, [state: state, engine: engine] ++ Keyword.delete(opts, :state))
  end

  test "next then done", %{engine: e, t: t} do
    id = insert(e, t, "next_done")
    assert_receive {:gd, ^id, "start", ctx, _}, 10_000
    assert %GenDurable.Context{id: ^id, workflow: "GenDurableTest.Steps", attempt: 1} = ctx
    assert_receive {:gd, ^id, "second", _, _}, 10_000
    i = wait_status(e, id, :completed)
    assert i.state["n"] == 2
    assert i.step == "second"
    assert %DateTime{} = i.finished_at
  end

  test "next releases the concurrency key", %{engine: e, t: t} do
    id = insert(e, t, "release", concurrency_key: {:acct, 1})
    assert_receive {:gd, ^id, "start", %{concurrency_key: "acct:1"}, _}, 10_000
    assert_receive {:gd, ^id, "b", %{concurrency_key: nil}, _}, 10_000
    assert wait_status(e, id, :completed).concurrency_key == nil
  end

  test "next switches the key, sets a rate limit and a delay", %{engine: e, t: t} do
    id = insert(e, t, "switch", concurrency_key: "acct:2")
    assert_receive {:gd, ^id, "start", %{concurrency_key: "acct:2"}, _}, 10_000
    assert_receive {:gd, ^id, "b", ctx, _}, 10_000
    assert ctx.concurrency_key == "tenant:7"
    assert ctx.rate_limit == "api:t1"
    wait_status(e, id, :completed)
  end

  test "await a signal, woken by name with a payload", %{engine: e, t: t} do
    signal = "go:#{unique()}"
    id = insert(e, t, "await_signal", state: %{"signal" => signal})
    assert_receive {:gd, ^id, "start", _, _}, 10_000
    i = wait_status(e, id, :awaiting)
    assert i.await_signal == signal
    assert {:ok, 1} = GenDurable.signal(signal, %{"v" => 1}, engine: e)
    assert_receive {:gd, ^id, "woken", ctx, _}, 10_000
    assert ctx.wake == {:signal, signal, %{"v" => 1}}
    wait_status(e, id, :completed)
    # Nothing awaits it any more: the signal is not kept.
    assert {:ok, 0} = GenDurable.signal(signal, %{}, engine: e)
  end

  test "await a signal, woken by id", %{engine: e, t: t} do
    id = insert(e, t, "await_both", state: %{"signal" => "never"})
    assert_receive {:gd, ^id, "start", _, _}, 10_000
    wait_status(e, id, :awaiting)
    assert {:ok, true} = GenDurable.signal_instance(id, "poke", [1, 2], engine: e)
    assert_receive {:gd, ^id, "woken", %{wake: {:signal, "poke", [1, 2]}}, _}, 10_000
    assert {:ok, false} = GenDurable.signal_instance(id, "poke", %{}, engine: e)
  end

  test "await a timeout", %{engine: e, t: t} do
    id = insert(e, t, "await_timeout")
    assert_receive {:gd, ^id, "woken", %{wake: :timeout}, _}, 10_000
    wait_status(e, id, :completed)
  end

  test "await until a time", %{engine: e, t: t} do
    id = insert(e, t, "await_until")
    assert_receive {:gd, ^id, "woken", %{wake: :timeout}, _}, 10_000
  end

  test "snooze runs the step again without counting an attempt", %{engine: e, t: t} do
    id = insert(e, t, "snooze")
    assert_receive {:gd, ^id, "start", %{attempt: 1}, _}, 10_000
    assert_receive {:gd, ^id, "start", %{attempt: 1}, _}, 10_000
    assert wait_status(e, id, :completed).state["runs"] == 2
  end

  test "error is retried until max_attempts, then discarded", %{engine: e, t: t} do
    id = insert(e, t, "error", max_attempts: 2)
    assert_receive {:gd, ^id, "start", %{attempt: 1}, _}, 10_000
    assert_receive {:gd, ^id, "start", %{attempt: 2}, _}, 10_000
    i = wait_status(e, id, :discarded)
    assert [%{"message" => "boom 1"}, %{"message" => "boom 2"}] = i.errors
  end

  test "error then success", %{engine: e, t: t} do
    id = insert(e, t, "flaky")
    assert wait_status(e, id, :completed).state["attempt"] == 3
  end

  test "discard: discarded at once, whatever attempts are left", %{engine: e, t: t} do
    id = insert(e, t, "discard", max_attempts: 5)
    assert_receive {:gd, ^id, "start", %{attempt: 1}, _}, 10_000
    assert_receive {:gd, ^id, "start", %{attempt: 2}, _}, 10_000
    i = wait_status(e, id, :discarded)
    assert i.attempt == 2

    assert [
             %{"kind" => "error", "attempt" => 1, "message" => "gateway timeout"},
             %{"kind" => "discard", "attempt" => 2, "message" => "card declined"}
           ] = i.errors

    refute_receive {:gd, ^id, "start", _, _}, 200
  end

  test "a discard's reason is formatted like an error's; a malformed one is an error",
       %{engine: e, t: t} do
    id1 = insert(e, t, "discard_atom", max_attempts: 5)

    assert [%{"kind" => "discard", "message" => "card_declined"}] =
             wait_status(e, id1, :discarded).errors

    # An error outcome (retried), not a discard.
    id2 = insert(e, t, "bad_discard", max_attempts: 2)
    i = wait_status(e, id2, :discarded)
    assert i.attempt == 2
    assert [%{"kind" => "error", "message" => m}, %{"kind" => "error"}] = i.errors
    assert m =~ "invalid value"
    assert m =~ "{:discard}"

    # The engine runs on.
    id3 = insert(e, t, "next_done")
    wait_status(e, id3, :completed)
  end

  test "cancel", %{engine: e, t: t} do
    id = insert(e, t, "cancel")
    i = wait_status(e, id, :cancelled)
    assert [%{"kind" => "cancel", "message" => "not needed"}] = i.errors
  end

  test "a raise is an error with its stacktrace", %{engine: e, t: t} do
    id = insert(e, t, "raise", max_attempts: 1)
    i = wait_status(e, id, :discarded)
    assert [%{"message" => "bad things happened", "detail" => detail}] = i.errors
    assert detail =~ "ArgumentError"
    assert detail =~ "GenDurableTest.Steps"
  end

  test "a throw and an exit are errors", %{engine: e, t: t} do
    id1 = insert(e, t, "throw", max_attempts: 1)
    id2 = insert(e, t, "exit", max_attempts: 1)
    assert [%{"message" => m1}] = wait_status(e, id1, :discarded).errors
    assert m1 =~ ":ball"
    assert [%{"message" => m2}] = wait_status(e, id2, :discarded).errors
    assert m2 =~ ":went_away"
  end

  test "a step whose process is killed is an error", %{engine: e, t: t} do
    id = insert(e, t, "kill", max_attempts: 1)
    assert [%{"message" => m}] = wait_status(e, id, :discarded).errors
    assert m =~ "killed"
  end

  test "a step process killed from outside is an error", %{engine: e, t: t} do
    id = insert(e, t, "block", max_attempts: 1)
    assert_receive {:gd, ^id, "start", _, pid}, 10_000
    Process.exit(pid, :shutdown)
    assert [%{"message" => m}] = wait_status(e, id, :discarded).errors
    assert m =~ "shutdown"
  end

  test "an invalid return value or a non-JSON state is an error", %{engine: e, t: t} do
    id1 = insert(e, t, "invalid", max_attempts: 1)
    id2 = insert(e, t, "not_json", max_attempts: 1)
    assert [%{"message" => m1}] = wait_status(e, id1, :discarded).errors
    assert m1 =~ "invalid value"
    assert [%{"message" => m2}] = wait_status(e, id2, :discarded).errors
    assert m2 =~ "not JSON"
  end

  test "cancel from outside: awaiting now, executing at its outcome", %{engine: e, t: t} do
    id1 = insert(e, t, "await_signal", state: %{"signal" => "never"})
    wait_status(e, id1, :awaiting)
    assert {:ok, :now} = GenDurable.cancel(id1, engine: e)
    assert {:ok, {:already_finished, :cancelled}} = GenDurable.cancel(id1, engine: e)

    id2 = insert(e, t, "block")
    assert_receive {:gd, ^id2, "start", _, pid}, 10_000
    assert {:ok, :at_outcome} = GenDurable.cancel(id2, engine: e, reason: "stop")
    # Its step asks for a next step; the recorded outcome is the cancellation.
    send(pid, :continue)
    wait_status(e, id2, :cancelled)
  end

  test "insert options are stored", %{engine: e, t: t} do
    at = DateTime.add(DateTime.utc_now(), 3600, :second)

    id =
      insert(e, t, "next_done",
        step: "second",
        queue: "elsewhere",
        priority: 3,
        concurrency_key: {"k", 1},
        rate_limit: "api:x",
        scheduled_at: at,
        max_attempts: 4
      )

    {:ok, i} = GenDurable.get(id, engine: e)
    assert i.step == "second"
    assert i.queue == "elsewhere"
    assert i.priority == 3
    assert i.concurrency_key == "k:1"
    assert i.rate_limit == "api:x"
    assert i.max_attempts == 4
    assert i.status == :scheduled
    assert abs(DateTime.diff(i.scheduled_at, at, :millisecond)) < 1000
  end

  test "insert_all inserts in order", %{engine: e, t: t} do
    {:ok, ids} =
      GenDurable.insert_all(
        for(n <- 1..5, do: {Steps, state: %{"test" => t, "mode" => "next_done", "k" => n}}),
        engine: e
      )

    assert length(ids) == 5

    for {id, n} <- Enum.with_index(ids, 1),
        do: assert(wait_status(e, id, :completed).state["k"] == n)
  end
end

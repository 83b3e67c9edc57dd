defmodule GenDurable.CrashTest do
  # Each process of an engine's tree is killed in turn while instances are
  # inserted and run: the Engine, the dispatcher, the step processes'
  # supervisor, then the tree's top (its `GenDurable` supervisor, started
  # under a supervisor of the test's, as an application would).
  #
  # What died is restarted; every instance completes; a step fails only when
  # its own process was killed (with the step processes' supervisor or with
  # the whole tree), never because the Engine or the dispatcher restarted;
  # and one node is left in the `nodes` table: the stopped ones removed
  # their rows, no old engine keeps running beside the new one.
  use ExUnit.Case, async: false
  import GenDurable.TestHelper

  alias GenDurableTest.{Churn, Spawner}

  @moduletag timeout: 600_000
  @moduletag :capture_log

  test "killing each process of the tree in turn under load" do
    opts = engine_opts(workflows: [Churn], queues: [default: 10])
    e = opts[:name]
    schema = opts[:schema]

    app =
      start_supervised!(%{
        id: :app,
        type: :supervisor,
        start: {Supervisor, :start_link, [[{GenDurable, opts}], [strategy: :one_for_one]]}
      })

    inserter = start_inserter(e)

    # The Engine and the dispatcher: nothing fails.
    for child <- [Engine, Dispatcher] do
      Process.sleep(1_500)
      kill_and_await_restart(Module.concat(e, child))
    end

    Process.sleep(1_000)
    ids = inserted(inserter)
    assert length(ids) > 100
    await_completed(schema, ids)

    assert sql("SELECT count(*) FROM #{schema}.instances WHERE errors <> '[]'") == ["0"],
           "steps failed although only the Engine and the dispatcher were killed: " <>
             inspect(errors(schema))

    # The step processes' supervisor and the top: the steps running then
    # are killed, and retried.
    for child <- [Module.concat(e, Tasks), e] do
      Process.sleep(1_500)
      kill_and_await_restart(child)
    end

    Process.sleep(1_000)
    ids = inserted(inserter, :stop)
    await_completed(schema, ids)

    for message <- errors(schema) do
      assert message =~ ~r/the step's process exited|the engine's dispatcher stopped/,
             "unexpected error: #{message}"
    end

    # Stopped nodes removed their rows (a killed one is forgotten once
    # silent for three leases): one node is left.
    eventually(fn -> sql("SELECT count(*) FROM #{schema}.nodes") == ["1"] end)
    assert Process.alive?(app)
    assert {:ok, id} = GenDurable.insert(Churn, engine: e)
    assert %{state: %{"done" => true}} = wait_status(e, id, :completed)
  end

  test "steps that insert while their node stops are not held up" do
    opts = engine_opts(workflows: [Churn, Spawner], queues: [default: 20])
    e = opts[:name]
    start_supervised!({GenDurable, opts})
    state = %{"engine" => Atom.to_string(e), "sleep" => 500}
    ids = for _ <- 1..10, do: GenDurable.insert!(Spawner, state: state, engine: e)

    # The steps are running; they insert while the killed Engine's node
    # stops, which waits for them.
    Process.sleep(200)
    t0 = System.monotonic_time(:millisecond)
    kill_and_await_restart(Module.concat(e, Engine))

    for id <- ids do
      %{state: %{"child" => child}, errors: []} = wait_status(e, id, :completed)
      wait_status(e, child, :completed)
    end

    # Well before the shutdown timeout (5 s): nothing waited for it.
    assert System.monotonic_time(:millisecond) - t0 < 4_000
  end

  test "runners killed one at a time under load: every instance completes" do
    # A runner is killed while idle, just woken for a step, between taking
    # a step and beginning it, or while running it. A step no runner began
    # stays queued (or is snoozed) and runs in another one; a step killed
    # while running is retried.
    opts = engine_opts(workflows: [Churn], queues: [default: 20])
    e = opts[:name]
    schema = opts[:schema]
    start_supervised!({GenDurable, opts})
    inserter = start_inserter(e)
    killed = kill_runners(Process.whereis(Module.concat(e, Tasks)), 150, 0)
    ids = inserted(inserter, :stop)
    assert killed > 0
    assert length(ids) > 100
    await_completed(schema, ids)

    for message <- errors(schema) do
      assert message =~ "the step's process exited: killed", "unexpected error: #{message}"
    end
  end

  # Kills a random runner (a process linked to the step processes' owner
  # and started as a runner) every 10 ms, `n` times; returns how many it
  # found to kill.
  defp kill_runners(_tasks, 0, killed), do: killed

  defp kill_runners(tasks, n, killed) do
    Process.sleep(10)
    {:links, links} = Process.info(tasks, :links)

    runners =
      for pid <- links,
          is_pid(pid),
          Process.info(pid, :initial_call) == {:initial_call, {GenDurable.Runner, :start, 1}},
          do: pid

    case runners do
      [] ->
        kill_runners(tasks, n - 1, killed)

      _ ->
        Process.exit(Enum.random(runners), :kill)
        kill_runners(tasks, n - 1, killed + 1)
    end
  end

  defp kill_and_await_restart(name) do
    pid = Process.whereis(name)
    assert is_pid(pid), "#{inspect(name)} is not running"
    Process.exit(pid, :kill)
    eventually(fn -> (new = Process.whereis(name)) && new != pid end)
  end

  # Inserts instances in small batches until told to stop, retrying while
  # no engine is running (the tree's top restarting).
  defp start_inserter(e) do
    test = self()
    spawn_link(fn -> insert_loop(e, test, []) end)
  end

  defp insert_loop(e, test, ids) do
    receive do
      {:ids, from, stop?} ->
        send(from, {:ids, Enum.reverse(ids)})
        unless stop?, do: insert_loop(e, test, ids)
    after
      10 ->
        case GenDurable.insert_all(for(_ <- 1..5, do: {Churn, []}), engine: e) do
          {:ok, new} ->
            insert_loop(e, test, Enum.reverse(new, ids))

          {:error, %GenDurable.Error{kind: kind}} when kind in [:not_running, :shut_down] ->
            insert_loop(e, test, ids)
        end
    end
  end

  defp inserted(inserter, stop \\ nil) do
    send(inserter, {:ids, self(), stop == :stop})
    assert_receive {:ids, ids}, 10_000
    ids
  end

  defp await_completed(schema, ids) do
    last = Enum.max(ids)

    eventually(
      fn ->
        sql(
          "SELECT count(*) FROM #{schema}.instances WHERE id <= #{last} AND status <> 'completed'"
        ) == ["0"]
      end,
      120_000
    )

    assert sql("SELECT count(*) FROM #{schema}.instances WHERE id <= #{last}") ==
             ["#{length(ids)}"]
  end

  defp errors(schema) do
    sql("SELECT e->>'message' FROM #{schema}.instances, jsonb_array_elements(errors) e")
  end
end

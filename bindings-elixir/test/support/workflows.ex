defmodule GenDurableTest.Steps do
  @moduledoc false
  # One workflow whose behaviour is chosen by the state's "mode".
  use GenDurable
  import GenDurable.TestHelper, only: [notify: 3]

  @impl true
  def handle_step(step, state, ctx) do
    notify(state, step, ctx)
    run(state["mode"], step, state, ctx)
  end

  defp run("next_done", "start", s, _), do: {:next, "second", Map.put(s, "n", 1)}
  defp run("next_done", "second", s, _), do: {:done, Map.update!(s, "n", &(&1 + 1))}

  defp run("release", "start", s, _), do: {:next, "b", s, concurrency_key: nil}

  defp run("switch", "start", s, _),
    do: {:next, "b", s, concurrency_key: {:tenant, 7}, rate_limit: "api:t1", schedule_in: 10}

  defp run("await_signal", "start", s, _), do: {:await, "woken", s, signal: s["signal"]}
  defp run("await_timeout", "start", s, _), do: {:await, "woken", s, timeout: 50}

  defp run("await_until", "start", s, _),
    do: {:await, "woken", s, until: DateTime.add(DateTime.utc_now(), 50, :millisecond)}

  defp run("await_both", "start", s, _),
    do: {:await, "woken", s, signal: s["signal"], timeout: 600_000}

  defp run("snooze", "start", s, ctx) do
    case :ets.update_counter(:gd_test, {ctx.id, :runs}, 1, {{ctx.id, :runs}, 0}) do
      1 -> {:snooze, 20}
      n -> {:done, Map.put(s, "runs", n)}
    end
  end

  defp run("error", "start", _s, ctx), do: {:error, "boom #{ctx.attempt}"}

  defp run("flaky", "start", s, ctx) do
    if ctx.attempt < 3, do: {:error, :flaky}, else: {:done, Map.put(s, "attempt", ctx.attempt)}
  end

  defp run("discard", "start", _s, %{attempt: 1}), do: {:error, "gateway timeout"}
  defp run("discard", "start", _s, _), do: {:discard, "card declined"}
  defp run("discard_atom", "start", _s, _), do: {:discard, :card_declined}
  defp run("bad_discard", "start", _s, _), do: {:discard}
  defp run("cancel", "start", _s, _), do: {:cancel, "not needed"}
  defp run("raise", "start", _s, _), do: raise(ArgumentError, "bad things happened")
  defp run("throw", "start", _s, _), do: throw(:ball)
  defp run("exit", "start", _s, _), do: exit(:went_away)

  defp run("kill", "start", _s, _) do
    Process.exit(self(), :kill)
    {:done, %{}}
  end

  defp run("invalid", "start", _s, _), do: :what
  defp run("not_json", "start", _s, _), do: {:done, %{"pid" => self()}}

  defp run("block", "start", s, _) do
    receive do
      :continue -> {:next, "b", s}
    end
  end

  defp run("forever", "start", s, ctx) do
    GenDurable.TestHelper.watch(s, "start", ctx)
    Process.sleep(:infinity)
  end

  defp run(_, "b", s, _), do: {:done, s}
  defp run(_, "woken", s, ctx), do: {:done, Map.put(s, "wake", inspect(ctx.wake))}
end

defmodule GenDurableTest.Timed do
  @moduledoc false
  # Records when each step starts and ends, per concurrency key.
  use GenDurable

  @impl true
  def handle_step("start", state, ctx) do
    t0 = System.monotonic_time()
    Process.sleep(state["work_ms"] || 20)
    t1 = System.monotonic_time()
    :ets.insert(:gd_test, {{:span, state["run"], ctx.id}, ctx.concurrency_key, t0, t1})
    GenDurable.TestHelper.notify(state, "start", ctx)
    {:done, state}
  end
end

defmodule Account.Sync do
  @moduledoc false
  # Run by Elixir, inserted from Rust (the CLI) in the cross-language test.
  use GenDurable

  @impl true
  def handle_step("start", state, ctx) do
    GenDurable.TestHelper.notify(state, "start", ctx)
    {:next, "finish", Map.put(state, "synced_by", "elixir")}
  end

  def handle_step("finish", state, ctx) do
    GenDurable.TestHelper.notify(state, "finish", ctx)
    {:done, state}
  end
end

defmodule GenDurableTest.Limited do
  @moduledoc false
  # Rate-limit keys declared per step.
  use GenDurable,
    rate_limits: %{"call_api" => "openai:default", "after_wait" => "openai:waited"}

  import GenDurable.TestHelper, only: [notify: 3]

  @impl true
  def handle_step(step, state, ctx) do
    notify(state, step, ctx)
    run(step, state)
  end

  defp run("start", %{"mode" => "explicit"} = s), do: {:next, "call_api", s, rate_limit: "api:x"}
  defp run("start", %{"mode" => "await"} = s), do: {:await, "after_wait", s, timeout: 10}
  defp run("start", s), do: {:next, "call_api", s}
  defp run(_step, s), do: {:done, s}
end

defmodule GenDurableTest.RoundTrip do
  @moduledoc false
  # Shows the test process (named in the state's "test") the state and the
  # wake-up each step gets; awaits a signal named after the instance, then
  # finishes with the state it was given.
  use GenDurable

  @impl true
  def handle_step("start", state, ctx) do
    report(state, "start", ctx)
    {:await, "woken", state, signal: "rt:#{ctx.id}"}
  end

  def handle_step("woken", state, ctx) do
    report(state, "woken", ctx)
    {:done, state}
  end

  defp report(%{"test" => test} = state, step, ctx) do
    send(String.to_existing_atom(test), {:rt, ctx.id, step, state, ctx.wake})
  end
end

defmodule GenDurableTest.Churn do
  @moduledoc false
  # Two short steps, for runs where processes of the tree are killed.
  use GenDurable

  @impl true
  def handle_step("start", state, _ctx) do
    Process.sleep(:rand.uniform(20))
    {:next, "finish", state}
  end

  def handle_step("finish", state, _ctx), do: {:done, Map.put(state, "done", true)}
end

defmodule GenDurableTest.Big do
  @moduledoc false
  # Large values crossing the NIF: a step result of `state["list"]`
  # integers, or a signal payload whose length the next step records.
  use GenDurable

  @impl true
  def handle_step("start", %{"list" => n}, _ctx), do: {:done, %{"list" => :lists.seq(1, n)}}
  def handle_step("start", state, _ctx), do: {:await, "woken", state, signal: state["signal"]}

  def handle_step("woken", state, %{wake: {:signal, _, payload}}),
    do: {:done, Map.put(state, "length", length(payload))}
end

defmodule GenDurableTest.Spawner do
  @moduledoc false
  # A step that inserts another instance (a Churn) after `state["sleep"]` ms.
  use GenDurable

  @impl true
  def handle_step("start", state, _ctx) do
    Process.sleep(state["sleep"])
    engine = String.to_existing_atom(state["engine"])
    {:ok, child} = GenDurable.insert(GenDurableTest.Churn, engine: engine)
    {:done, Map.put(state, "child", child)}
  end
end

defmodule GenDurableTest.Charge do
  @moduledoc false
  # Declares the queue, priority and attempts of an insert that names none.
  use GenDurable, queue: "billing", priority: 2, max_attempts: 5, backoff: {1_000, 60_000}

  @impl true
  def handle_step(_step, state, _ctx), do: {:done, state}
end

defmodule GenDurableTest.Refund do
  @moduledoc false
  # Declares only its attempts, next to a rate limit.
  use GenDurable, rate_limits: %{"call_api" => "api:refunds"}, max_attempts: 3

  @impl true
  def handle_step(_step, state, _ctx), do: {:done, state}
end

defmodule GenDurableTest.AlwaysFails do
  @moduledoc false
  # Fails every attempt; its own attempts and backoff decide when it is
  # discarded.
  use GenDurable, max_attempts: 2, backoff: {10, 50}
  import GenDurable.TestHelper, only: [notify: 3]

  @impl true
  def handle_step(step, state, ctx) do
    notify(state, step, ctx)
    {:error, "upstream said no (attempt #{ctx.attempt})"}
  end
end

defmodule GenDurableTest.BadPriority do
  @moduledoc false
  # A default the core refuses (priorities are 0 to 9): compiles, and stops
  # the engine that runs it from starting.
  use GenDurable, priority: 12

  @impl true
  def handle_step(_step, state, _ctx), do: {:done, state}
end

defmodule GenDurableTest.Slow do
  @moduledoc false
  # Steps that do not finish on their own, under the workflow's timeout and
  # a shorter one declared for the step "hang". Each has its process
  # watched (see watch/3) and tells the test (notify/3) before it blocks.
  # "late" suspends the engine's dispatcher (named by the state's
  # "dispatcher") and answers when the test sends it `:continue`.
  use GenDurable,
    timeout: 400,
    step_timeouts: %{"hang" => 200},
    max_attempts: 2,
    backoff: {10, 20}

  import GenDurable.TestHelper, only: [notify: 3, watch: 3]

  @impl true
  def handle_step("start", %{"mode" => "hang"} = state, _ctx), do: {:next, "hang", state}
  def handle_step("start", %{"mode" => "done"} = state, _ctx), do: {:done, state}

  def handle_step(step, state, ctx) do
    # The dispatcher stays suspended past the timeout, so that the step
    # outlives it and answers late.
    if state["mode"] == "late", do: :sys.suspend(String.to_existing_atom(state["dispatcher"]))
    watch(state, step, ctx)
    notify(state, step, ctx)

    case state["mode"] do
      "late" ->
        receive do
          :continue -> {:done, state}
        end

      _ ->
        Process.sleep(:infinity)
    end
  end
end

defmodule GenDurableTest.Mailbox do
  @moduledoc false
  # Awaits the signal named by the state's "on" `left` times, recording each
  # signal it is woken with in "got". With "hold", its first step waits for
  # the test's `:continue` before it returns.
  use GenDurable
  import GenDurable.TestHelper, only: [notify: 3]

  @impl true
  def handle_step(step, state, ctx) do
    notify(state, step, ctx)

    if step == "start" and state["hold"] do
      receive do
        :continue -> :ok
      end
    end

    state =
      case ctx.wake do
        {:signal, name, payload} -> Map.update!(state, "got", &(&1 ++ [[name, payload]]))
        _ -> state
      end

    case state["left"] do
      0 -> {:done, state}
      n -> {:await, "again", %{state | "left" => n - 1}, signal: state["on"]}
    end
  end
end

defmodule GenDurableTest.Tick do
  @moduledoc false
  # Inserted by a cron entry: tells the test each time it runs.
  use GenDurable
  import GenDurable.TestHelper, only: [notify: 3]

  @impl true
  def handle_step(step, state, ctx) do
    notify(state, step, ctx)
    {:done, state}
  end
end

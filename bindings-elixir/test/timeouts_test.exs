defmodule GenDurable.TimeoutsTest do
  # Step timeouts declared with `use GenDurable, timeout: ms, step_timeouts:
  # %{step => ms}`, and the cancellation of an executing instance: the core
  # stops the step, and its Elixir process is killed.
  use ExUnit.Case, async: true
  import GenDurable.TestHelper

  alias GenDurable.Error
  alias GenDurableTest.{Slow, Steps}

  test "the declarations become the core's workflow_defaults and step_timeouts" do
    {:ok, v} = GenDurable.Options.validate(engine_opts(workflows: [Slow]))

    assert v.config.options["workflow_defaults"]["GenDurableTest.Slow"]["timeout"] == 400
    assert v.config.options["step_timeouts"] == %{"GenDurableTest.Slow" => %{"hang" => 200}}
  end

  test "a step past its timeout is killed, recorded as a timeout, retried, then discarded" do
    e = start_engine(workflows: [Slow])
    t = register()
    id = GenDurable.insert!(Slow, state: %{"test" => t, "mode" => "hang"}, engine: e)

    # The step's own timeout (200 ms), not the workflow's (400 ms).
    for attempt <- [1, 2] do
      assert_receive {:gd, ^id, "hang", %{attempt: ^attempt}, _pid}, 10_000
      assert_receive {:step_down, ^id, "hang", ^attempt, :killed}, 10_000
    end

    i = wait_status(e, id, :discarded)

    assert [
             %{"kind" => "timeout", "attempt" => 1, "message" => m},
             %{"kind" => "timeout", "attempt" => 2}
           ] = i.errors

    assert m == ~s(step "hang" timed out after 200ms)
    refute_receive {:gd, ^id, _, _, _}, 100
  end

  test "a step without a timeout of its own takes the workflow's" do
    e = start_engine(workflows: [Slow])
    t = register()

    id =
      GenDurable.insert!(Slow,
        state: %{"test" => t, "mode" => "sleep"},
        max_attempts: 1,
        engine: e
      )

    assert_receive {:step_down, ^id, "start", 1, :killed}, 10_000
    i = wait_status(e, id, :discarded)

    assert [%{"kind" => "timeout", "message" => ~s(step "start" timed out after 400ms)}] =
             i.errors
  end

  test "a step answering after its timeout is ignored" do
    e = start_engine(workflows: [Slow])
    t = register()
    dispatcher = Module.concat(e, Dispatcher)
    before = Process.whereis(dispatcher)

    state = %{"test" => t, "mode" => "late", "dispatcher" => Atom.to_string(dispatcher)}
    id = GenDurable.insert!(Slow, state: state, max_attempts: 1, engine: e)
    assert_receive {:gd, ^id, "start", _, step_pid}, 10_000

    # Its dispatcher suspended, the step outlives its timeout: the outcome
    # is written without it.
    i = wait_status(e, id, :discarded)
    assert [%{"kind" => "timeout"}] = i.errors

    # Its answer comes too late: ignored, and the process ends normally.
    send(step_pid, :continue)
    assert_receive {:step_down, ^id, "start", 1, :normal}, 10_000
    :sys.resume(dispatcher)

    assert Process.whereis(dispatcher) == before

    assert {:ok, %{status: :discarded, errors: [%{"kind" => "timeout"}]}} =
             GenDurable.get(id, engine: e)

    # The engine runs on.
    done = GenDurable.insert!(Slow, state: %{"mode" => "done"}, engine: e)
    wait_status(e, done, :completed)
  end

  test "cancelling an executing instance kills its step's process" do
    e = start_engine(workflows: [Steps])
    t = register()
    id = GenDurable.insert!(Steps, state: %{"test" => t, "mode" => "forever"}, engine: e)
    assert_receive {:gd, ^id, "start", _, _pid}, 10_000

    assert {:ok, :at_outcome} = GenDurable.cancel(id, reason: "no longer needed", engine: e)
    assert_receive {:step_down, ^id, "start", 1, :killed}, 10_000

    i = wait_status(e, id, :cancelled)
    assert %{"kind" => "cancel"} = List.last(i.errors)
  end

  describe "use GenDurable, step_timeouts:" do
    test "is a map of step names to positive milliseconds" do
      for {declared, text} <- [
            {[capture: 10], "step_timeouts must be a map of step names to milliseconds"},
            {%{capture: 10}, "step names must be non-empty strings, got: :capture"},
            {%{"capture" => 0}, ~s(the timeout of step "capture" must be a positive integer)},
            {%{"capture" => 1.5}, "got: 1.5"}
          ] do
        e = assert_raise ArgumentError, fn -> workflow_module(step_timeouts: declared) end
        assert e.message =~ text, "#{inspect(declared)}: #{e.message}"
      end

      mod = workflow_module(step_timeouts: %{"capture" => 10_000}, timeout: 30_000)
      assert mod.__gen_durable_step_timeouts__() == %{"capture" => 10_000}
      assert mod.__gen_durable_defaults__() == [timeout: 30_000]
    end

    test "a workflow timeout the core refuses stops the engine from starting" do
      Process.flag(:trap_exit, true)
      mod = workflow_module(timeout: -5)

      assert {:error, %Error{kind: :invalid_config, message: m}} =
               GenDurable.start_link(engine_opts(workflows: [mod]))

      assert m =~
               ~s(engine option workflow_defaults["#{inspect(mod)}"].timeout: ) <>
                 "expected a positive integer (milliseconds), got -5"
    end
  end

  defp workflow_module(opts) do
    mod = Module.concat(__MODULE__, "W#{unique()}")

    Code.compile_quoted(
      quote do
        defmodule unquote(mod) do
          use GenDurable, unquote(Macro.escape(opts))
          def handle_step(_step, state, _ctx), do: {:done, state}
        end
      end
    )

    mod
  end
end

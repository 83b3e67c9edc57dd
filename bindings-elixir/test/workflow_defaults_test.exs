defmodule GenDurable.WorkflowDefaultsTest do
  use ExUnit.Case, async: true
  import GenDurable.TestHelper

  alias GenDurable.Error
  alias GenDurableTest.{AlwaysFails, BadPriority, Charge, Refund, Steps}

  @rates [api: [limit: 1000, period: 1000]]

  describe "a running engine" do
    setup do
      %{engine: start_engine(workflows: [Charge, Refund, Steps], rate_limits: @rates)}
    end

    defp stored(engine, id) do
      {:ok, i} = GenDurable.get(id, engine: engine)
      {i.queue, i.priority, i.max_attempts}
    end

    test "an insert takes its workflow's defaults unless it names its own", %{engine: e} do
      assert stored(e, GenDurable.insert!(Charge, engine: e)) == {"billing", 2, 5}
      # By its name too: the core resolves them.
      assert stored(e, GenDurable.insert!("GenDurableTest.Charge", engine: e)) ==
               {"billing", 2, 5}

      own = GenDurable.insert!(Charge, queue: "default", priority: 0, max_attempts: 20, engine: e)
      assert stored(e, own) == {"default", 0, 20}

      {:ok, ids} =
        GenDurable.insert_all(
          [
            {Charge, priority: 7},
            {Charge, queue: "urgent"},
            {Charge, max_attempts: 1},
            {Refund, []},
            {Steps, state: %{"mode" => "cancel"}}
          ],
          engine: e
        )

      assert Enum.map(ids, &stored(e, &1)) == [
               {"billing", 7, 5},
               {"urgent", 2, 5},
               {"billing", 2, 1},
               {"default", 0, 3},
               {"default", 0, 20}
             ]
    end
  end

  test "a failing workflow is discarded after its declared max_attempts" do
    # The engine's backoff would hold the retry for ten minutes; the
    # workflow's retries it within 50 ms.
    e = start_engine(workflows: [AlwaysFails], backoff: [base: 600_000, max: 3_600_000])
    t = register()
    id = GenDurable.insert!(AlwaysFails, state: %{"test" => t}, engine: e)

    assert_receive {:gd, ^id, "start", %{attempt: 1, max_attempts: 2}, _}, 10_000
    assert_receive {:gd, ^id, "start", %{attempt: 2, max_attempts: 2}, _}, 10_000
    i = wait_status(e, id, :discarded)
    assert {i.attempt, i.max_attempts} == {2, 2}

    assert [
             %{"kind" => "error", "attempt" => 1, "message" => "upstream said no (attempt 1)"},
             %{"kind" => "error", "attempt" => 2, "message" => "upstream said no (attempt 2)"}
           ] = i.errors

    refute_receive {:gd, ^id, "start", _, _}, 200
  end

  describe "refused at engine start" do
    defp start(opts) do
      Process.flag(:trap_exit, true)
      GenDurable.start_link(engine_opts(opts))
    end

    test "a default the core refuses names the workflow and the option" do
      assert {:error, %Error{kind: :invalid_config, message: m}} =
               start(workflows: [Steps, BadPriority])

      assert m =~ ~s(workflow_defaults "GenDurableTest.BadPriority": )
      assert m =~ "priority"
      assert m =~ "12"
    end

    test "a backoff that is not {base, max} is the core's to refuse" do
      for {backoff, text} <- [
            {{0, 1000}, "backoff base must be longer than zero"},
            {{1, 2, 3}, "backoff: not JSON: a tuple is not JSON"},
            {5, "backoff: expected a map"}
          ] do
        mod = workflow_module(backoff: backoff)
        assert {:error, %Error{kind: :invalid_config, message: m}} = start(workflows: [mod])
        assert m =~ inspect(mod)
        assert m =~ text, "#{inspect(backoff)}: #{m}"
      end

      mod = workflow_module(backoff: [base: 10, max: 50])
      assert {:ok, pid} = start(workflows: [mod])
      Supervisor.stop(pid)
    end
  end

  test "use GenDurable refuses unknown options, not the core's values" do
    e = assert_raise ArgumentError, fn -> workflow_module(retries: 3) end
    assert e.message =~ "unknown option :retries"
    assert e.message =~ ":queue, :priority, :max_attempts, :backoff"

    mod = workflow_module(queue: "", priority: 12, max_attempts: 0, backoff: :soon)

    assert mod.__gen_durable_defaults__() == [
             queue: "",
             priority: 12,
             max_attempts: 0,
             backoff: :soon
           ]
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

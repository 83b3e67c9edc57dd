defmodule GenDurable.StepRateLimitsTest do
  use ExUnit.Case, async: true
  import GenDurable.TestHelper

  alias GenDurable.Error
  alias GenDurableTest.Limited

  @rates [openai: [limit: 1000, period: 1000, burst: 10], api: [limit: 1000, period: 1000]]

  describe "a running engine" do
    setup do
      %{engine: start_engine(workflows: [Limited], rate_limits: @rates), t: register()}
    end

    defp insert(engine, test, opts \\ []) do
      state = Map.merge(%{"test" => test}, Keyword.get(opts, :state, %{}))
      GenDurable.insert!(Limited, [state: state, engine: engine] ++ Keyword.delete(opts, :state))
    end

    test "a step moved to by :next runs under its declared key", %{engine: e, t: t} do
      id = insert(e, t)
      assert_receive {:gd, ^id, "start", %GenDurable.Context{rate_limit: nil}, _}, 10_000
      assert_receive {:gd, ^id, "call_api", ctx, _}, 10_000
      assert ctx.rate_limit == "openai:default"
      wait_status(e, id, :completed)
    end

    test "an explicit rate_limit wins over the declared one", %{engine: e, t: t} do
      id = insert(e, t, state: %{"mode" => "explicit"})
      assert_receive {:gd, ^id, "call_api", ctx, _}, 10_000
      assert ctx.rate_limit == "api:x"
      wait_status(e, id, :completed)
    end

    test "a step reached after an await runs under its declared key", %{engine: e, t: t} do
      id = insert(e, t, state: %{"mode" => "await"})
      assert_receive {:gd, ^id, "after_wait", ctx, _}, 10_000
      assert ctx.wake == :timeout
      assert ctx.rate_limit == "openai:waited"
      wait_status(e, id, :completed)
    end

    test "an instance inserted at a declared step gets its key", %{engine: e, t: t} do
      # The step runs under the key stored at the insert (reading the row
      # instead would race the running engine, which clears it at the end).
      id = insert(e, t, step: "call_api")
      assert_receive {:gd, ^id, "call_api", %{rate_limit: "openai:default"}, _}, 10_000

      id = insert(e, t, step: "call_api", rate_limit: "api:y")
      assert_receive {:gd, ^id, "call_api", %{rate_limit: "api:y"}, _}, 10_000
      wait_status(e, id, :completed)
    end
  end

  describe "refused at engine start" do
    defp start(opts) do
      Process.flag(:trap_exit, true)
      GenDurable.start_link(engine_opts(opts))
    end

    test "a declared key whose name is not configured" do
      assert {:error, %Error{kind: :invalid_config, message: m}} =
               start(workflows: [Limited], rate_limits: [api: [limit: 1, period: 1000]])

      # The core checks the declared keys against the configured rate limits.
      assert m =~ ~s(step_rate_limit "GenDurableTest.Limited"/)
      assert m =~ ~s("after_wait") or m =~ ~s("call_api")
      assert m =~ ~s(no rate limit named "openai" is configured)

      assert {:error, %Error{kind: :invalid_config, message: m}} = start(workflows: [Limited])
      assert m =~ ~s("openai")
    end

    test "a declaration read from a module that did not check it" do
      # Translated like the engine's options; the core reads the result.
      for {declared, text} <- [
            {"openai:x", ~s(]: expected a map, got "openai:x")},
            {%{"call_api" => 5}, ~s(].call_api: expected a string, got 5)},
            {%{"call_api" => {:openai, 1}}, ~s(].call_api: not JSON: a tuple is not JSON)},
            {[call_api: "openai:x", call_api: "openai:y"], ~s("call_api" is given twice)}
          ] do
        mod =
          workflow_module(
            quote do: def(__gen_durable_rate_limits__, do: unquote(Macro.escape(declared)))
          )

        assert {:error, %Error{kind: :invalid_config, message: m}} =
                 start(workflows: [mod], rate_limits: @rates)

        assert m =~ ~s(engine option step_rate_limits["#{inspect(mod)}"])
        assert m =~ text
      end
    end

    test "a declaration translated like the options" do
      for declared <- [[call_api: "openai:x"], %{call_api: "openai:x"}] do
        mod =
          workflow_module(
            quote do: def(__gen_durable_rate_limits__, do: unquote(Macro.escape(declared)))
          )

        name = :"rl_#{unique()}"
        assert {:ok, pid} = start(workflows: [mod], rate_limits: @rates, name: name)
        Supervisor.stop(pid)
      end
    end

    test "a key the core refuses" do
      mod = workflow_module(rate_limits: %{"call_api" => "openai:a\0b"})

      assert {:error, %Error{kind: :invalid_config, message: m}} =
               start(workflows: [mod], rate_limits: @rates)

      assert m =~ "call_api"
    end
  end

  test "bad declarations raise when the workflow module is compiled" do
    cases = [
      {[rate_limits: [call_api: "openai:x"]], "must be a map of step names"},
      {[rate_limits: %{call_api: "openai:x"}], "step names must be non-empty strings"},
      {[rate_limits: %{"" => "openai:x"}], "step names must be non-empty strings"},
      {[rate_limits: %{"call_api" => :openai}], ~s(the key for step "call_api")},
      {[rate_limits: %{"call_api" => ""}], ~s(the key for step "call_api")},
      {[rate_limits: %{"call_api" => ":x"}], ~s(the key for step "call_api")},
      {[colour: :blue], "unknown option :colour"},
      {:nope, "options must be a keyword list"}
    ]

    for {opts, text} <- cases do
      e = assert_raise ArgumentError, fn -> workflow_module(opts) end
      assert e.message =~ "use GenDurable in GenDurable.StepRateLimitsTest.W"
      assert e.message =~ text, "#{inspect(opts)}: #{e.message}"
    end
  end

  # Compiles a workflow module: `use GenDurable` with `opts`, or a module
  # with the given body and a handle_step/3.
  defp workflow_module(opts_or_body) do
    mod = Module.concat(__MODULE__, "W#{unique()}")

    body =
      case opts_or_body do
        {:def, _, _} = body ->
          quote do
            @behaviour GenDurable
            unquote(body)
          end

        opts ->
          quote do: use(GenDurable, unquote(Macro.escape(opts)))
      end

    Code.compile_quoted(
      quote do
        defmodule unquote(mod) do
          unquote(body)
          def handle_step(_step, state, _ctx), do: {:done, state}
        end
      end
    )

    mod
  end
end

defmodule GenDurable.StepProcessesTest do
  # Steps run in reused processes: a process that ends a step as it started
  # takes the next one; a step that changes its process (dictionary, Logger
  # metadata, links, a registered name, trapped exits, messages) ends it, so
  # that nothing of one step reaches the next.
  use ExUnit.Case, async: true
  import GenDurable.TestHelper

  defmodule Probe do
    use GenDurable

    @impl true
    def handle_step("start", state, ctx) do
      report(state, "start", ctx)
      leave(state["leave"], state)
      {:next, "after", state}
    end

    def handle_step("after", state, ctx) do
      report(state, "after", ctx)
      {:done, state}
    end

    defp report(%{"test" => test}, step, ctx) do
      seen = %{
        leak: Process.get(:leak),
        metadata: Logger.metadata()[:leak],
        links: Process.info(self(), :links),
        trap_exit: Process.info(self(), :trap_exit),
        name: Process.info(self(), :registered_name),
        messages: Process.info(self(), :messages)
      }

      send(String.to_existing_atom(test), {:ran, ctx.id, step, self(), seen})
    end

    defp leave(nil, _state), do: :ok
    defp leave("dictionary", _), do: Process.put(:leak, 1)
    defp leave("logger", _), do: Logger.metadata(leak: 1)
    defp leave("trap_exit", _), do: Process.flag(:trap_exit, true)
    defp leave("message", _), do: send(self(), :stray)
    defp leave("name", state), do: Process.register(self(), :"gd_probe_#{state["n"]}")
    defp leave("link", _), do: spawn_link(fn -> Process.sleep(5_000) end)
  end

  test "clean steps share processes" do
    e = start_engine(workflows: [Probe], queues: [default: 1])
    t = register()
    ids = for _ <- 1..10, do: GenDurable.insert!(Probe, state: %{"test" => t}, engine: e)
    for id <- ids, do: wait_status(e, id, :completed)

    pids =
      for id <- ids, step <- ["start", "after"] do
        assert_receive {:ran, ^id, ^step, pid, _}, 10_000
        pid
      end

    assert length(Enum.uniq(pids)) < length(pids)
  end

  test "a step that changes its process ends it: the next step sees nothing of it" do
    e = start_engine(workflows: [Probe], queues: [default: 1])
    t = register()

    for {leave, n} <- Enum.with_index(~w(dictionary logger trap_exit message name link)) do
      state = %{"test" => t, "leave" => leave, "n" => n}
      id = GenDurable.insert!(Probe, state: state, engine: e)
      assert_receive {:ran, ^id, "start", first, _}, 10_000
      assert_receive {:ran, ^id, "after", second, seen}, 10_000
      wait_status(e, id, :completed)

      assert second != first, "#{leave}: the step after ran in the same process"
      assert %{leak: nil, metadata: nil, trap_exit: {:trap_exit, false}} = seen
      assert seen.name == {:registered_name, []}
      assert seen.messages == {:messages, []}
      assert {:links, [_owner]} = seen.links
      refute Process.alive?(first), "#{leave}: the process was not ended"
    end
  end
end

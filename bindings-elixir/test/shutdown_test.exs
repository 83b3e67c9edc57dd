defmodule GenDurable.ShutdownTest do
  use ExUnit.Case, async: true
  import GenDurable.TestHelper

  alias GenDurableTest.Steps

  test "stopping the engine lets a running step finish and writes its outcome" do
    opts = engine_opts(workflows: [Steps])
    engine = opts[:name]
    {:ok, sup} = GenDurable.start_link(opts)
    Process.unlink(sup)
    t = register()

    id = GenDurable.insert!(Steps, state: %{"test" => t, "mode" => "block"}, engine: engine)

    assert_receive {:gd, ^id, "start", _, step_pid}, 10_000

    test = self()
    engine_pid = Process.whereis(Module.concat(engine, Engine))
    ref = Process.monitor(sup)

    spawn(fn ->
      :ok = Supervisor.stop(sup)
      send(test, :stopped)
    end)

    # The engine is shutting down: its terminate/2 waits for the core's reply.
    eventually(fn ->
      Process.info(engine_pid, :current_function) ==
        {:current_function, {GenDurable.Native, :await, 1}}
    end)

    # It waits for the running step rather than killing it.
    refute_received :stopped
    assert Process.alive?(step_pid)
    send(step_pid, :continue)
    assert_receive :stopped, 30_000
    assert_receive {:DOWN, ^ref, :process, _, _}

    {:ok, sup2} = GenDurable.start_link(Keyword.put(opts, :queues, []))
    {:ok, i} = GenDurable.get(id, engine: engine)
    # The step's outcome (next "b") was written before the engine stopped.
    assert i.step == "b"
    Supervisor.stop(sup2)

    assert {:error, %GenDurable.Error{kind: :not_running}} = GenDurable.get(id, engine: engine)
  end

  test "a step still running at the shutdown timeout has its process killed" do
    opts = engine_opts(workflows: [Steps], shutdown_timeout: 300)
    engine = opts[:name]
    {:ok, sup} = GenDurable.start_link(opts)
    Process.unlink(sup)
    t = register()

    id = GenDurable.insert!(Steps, state: %{"test" => t, "mode" => "forever"}, engine: engine)

    assert_receive {:gd, ^id, "start", _, step_pid}, 10_000
    ref = Process.monitor(step_pid)
    sup_ref = Process.monitor(sup)

    :ok = Supervisor.stop(sup)

    # Killed by the dispatcher when the core stopped waiting for it, not
    # shut down later with the engine's Task.Supervisor.
    assert_receive {:DOWN, ^ref, :process, ^step_pid, :killed}, 30_000
    assert_receive {:DOWN, ^sup_ref, :process, _, _}, 30_000

    # The VM, the NIF and a new engine are fine; a cancel for a process that
    # is gone is ignored.
    e = start_engine(workflows: [Steps])
    dispatcher = Process.whereis(Module.concat(e, Dispatcher))
    send(dispatcher, {:gen_durable_cancel, step_pid})

    id2 = GenDurable.insert!(Steps, state: %{"mode" => "next_done"}, engine: e)
    assert %{state: %{"n" => 2}} = wait_status(e, id2, :completed)
    assert Process.whereis(Module.concat(e, Dispatcher)) == dispatcher
  end
end

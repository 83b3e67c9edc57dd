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

    spawn(fn ->
      :ok = Supervisor.stop(sup)
      send(test, :stopped)
    end)

    # The engine waits for the step (its process is still alive and its
    # supervisor still running) rather than killing it.
    ref = Process.monitor(sup)
    refute_received :stopped
    assert Process.alive?(step_pid)
    send(step_pid, :continue)
    assert_receive :stopped, 30_000
    assert_receive {:DOWN, ^ref, :process, _, _}

    # The step's outcome (next "b") was written; "b" was not started here.
    refute_received {:gd, ^id, "b", _, _}

    {:ok, sup2} = GenDurable.start_link(Keyword.put(opts, :queues, []))
    {:ok, i} = GenDurable.get(id, engine: engine)
    assert i.step == "b"
    assert i.status in [:available, :scheduled]
    Supervisor.stop(sup2)

    assert {:error, %GenDurable.Error{kind: :not_running}} = GenDurable.get(id, engine: engine)
  end
end

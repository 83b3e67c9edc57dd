defmodule GenDurableTest.Mendable do
  @moduledoc false
  # Discards its instance until the test marks it mended (the `:gd_test`
  # table's `{id, :mended}`), then completes.
  use GenDurable
  import GenDurable.TestHelper, only: [notify: 3]

  @impl true
  def handle_step(step, state, ctx) do
    notify(state, step, ctx)

    case :ets.lookup(:gd_test, {ctx.id, :mended}) do
      [] -> {:discard, "supplier down"}
      _ -> {:done, state}
    end
  end
end

defmodule GenDurable.OperatingTest do
  # An operator's actions: pausing a queue, retrying and deleting one
  # instance, and counting, cancelling, retrying and deleting the instances
  # keyword conditions name. The core acts and checks; the binding passes
  # the conditions on.
  use ExUnit.Case, async: true
  import GenDurable.TestHelper

  alias GenDurable.{Error, Testing}
  alias GenDurableTest.{Charge, Mendable, Steps}

  test "a paused queue claims nothing until it is resumed" do
    e = start_engine(workflows: [Steps])
    t = register()

    assert {:ok, []} = GenDurable.paused_queues(engine: e)
    assert {:ok, true} = GenDurable.pause_queue(:default, engine: e)
    assert {:ok, false} = GenDurable.pause_queue("default", engine: e)
    assert {:ok, [{"default", %DateTime{} = since}]} = GenDurable.paused_queues(engine: e)
    assert DateTime.diff(DateTime.utc_now(), since) < 60

    # Inserted on a started node: not started here, nor picked anywhere.
    id = GenDurable.insert!(Steps, state: %{"test" => t, "mode" => "next_done"}, engine: e)
    assert GenDurable.get!(id, engine: e).status == :available
    assert %{steps: 0} = Testing.drain_queue(:default, engine: e)
    assert GenDurable.get!(id, engine: e).status == :available
    refute_received {:gd, ^id, _, _, _}

    assert {:ok, true} = GenDurable.resume_queue("default", engine: e)
    assert {:ok, false} = GenDurable.resume_queue("default", engine: e)
    assert {:ok, []} = GenDurable.paused_queues(engine: e)
    assert_receive {:gd, ^id, "start", _, _}, 10_000
    assert wait_status(e, id, :completed).state["n"] == 2
  end

  test "bulk actions name instances by conditions and count what they did" do
    # No node runs "billing" (Charge's queue) or "idle": what is inserted
    # stays available.
    e = start_engine(workflows: [Steps, Charge])
    charges = for _ <- 1..3, do: GenDurable.insert!(Charge, engine: e)
    idle = for _ <- 1..2, do: GenDurable.insert!(Steps, queue: "idle", engine: e)
    [c1, c2, c3] = charges

    assert {:ok, 3} = GenDurable.count(workflow: Charge, engine: e)
    assert {:ok, 3} = GenDurable.count([workflow: "GenDurableTest.Charge"], engine: e)
    assert {:ok, 3} = GenDurable.count(queue: :billing, status: :available, engine: e)
    assert {:ok, 2} = GenDurable.count(queue: "idle", engine: e)
    assert {:ok, 2} = GenDurable.count(ids: [c1, c2, -1], engine: e)
    assert {:ok, 1} = GenDurable.count(ids: c3, engine: e)
    assert {:ok, 0} = GenDurable.count(status: ["completed", :discarded], engine: e)
    assert {:ok, 0} = GenDurable.count(key: {:account, 7}, engine: e)

    assert {:ok, %{matched: 2, changed: 2}} =
             GenDurable.cancel_where([workflow: Charge, ids: [c1, c2]],
               reason: "supplier gone",
               engine: e
             )

    # Finished already: named, not changed.
    assert {:ok, %{matched: 2, changed: 0}} = GenDurable.cancel_where(ids: [c1, c2], engine: e)

    assert GenDurable.get!(c1, engine: e).status == :cancelled
    assert {:ok, 2} = GenDurable.count(status: :cancelled, engine: e)
    assert {:ok, 2} = GenDurable.count(error: "SUPPLIER GONE", engine: e)

    assert {:ok, %{matched: 3, changed: 2}} =
             GenDurable.retry_where(workflow: Charge, reason: "by hand", engine: e)

    assert {:ok, 3} = GenDurable.count(workflow: Charge, status: :available, engine: e)
    assert {:ok, 2} = GenDurable.count(error: "by hand", engine: e)

    assert {:ok, %{matched: 2, changed: 2}} = GenDurable.delete_where(queue: "idle", engine: e)

    for id <- idle do
      assert {:error, %Error{kind: :not_found}} = GenDurable.get(id, engine: e)
    end

    assert {:ok, 3} = GenDurable.count(status: [:available], engine: e)
  end

  test "conditions are checked before anything is done" do
    e = start_engine([])

    # At least one condition: the core's words.
    assert {:error, %Error{kind: :invalid_input, field: :filter, message: m}} =
             GenDurable.count(engine: e)

    assert m =~ "at least one condition"

    assert {:error, %Error{kind: :invalid_input, field: :filter}} =
             GenDurable.delete_where([], engine: e)

    assert {:error, %Error{kind: :invalid_input, field: :status, message: m}} =
             GenDurable.cancel_where(status: :done, engine: e)

    assert m =~ ~s(got "done")

    assert {:error, %Error{kind: :invalid_input, field: :queue}} =
             GenDurable.retry_where(queue: "", engine: e)

    assert {:error, %Error{kind: :invalid_input, field: :options, message: m}} =
             GenDurable.count(colour: "red", engine: e)

    assert m =~ "unknown option :colour"

    # delete_where records no reason.
    assert {:error, %Error{field: :options}} =
             GenDurable.delete_where([queue: "q"], reason: "x", engine: e)

    assert {:error, %Error{field: :ids}} = GenDurable.count(ids: ["1"], engine: e)
    assert {:error, %Error{field: :key}} = GenDurable.count(key: 7, engine: e)
    assert {:error, %Error{field: :workflow}} = GenDurable.count(workflow: Enum, engine: e)
    assert {:error, %Error{field: :conditions}} = GenDurable.count(%{queue: "q"})
    assert {:error, %Error{field: :id}} = GenDurable.retry("1", engine: e)
    assert {:error, %Error{field: :queue}} = GenDurable.pause_queue("", engine: e)
    assert {:error, %Error{kind: :not_running}} = GenDurable.count(queue: "q", engine: :nope)
    assert {:error, %Error{kind: :not_running}} = GenDurable.pause_queue("q", engine: :nope)
  end

  test "a discarded instance retried runs again" do
    e = start_engine(workflows: [Mendable])
    t = register()
    id = GenDurable.insert!(Mendable, state: %{"test" => t}, engine: e)
    assert_receive {:gd, ^id, "start", %{attempt: 1}, _}, 10_000
    wait_status(e, id, :discarded)

    :ets.insert(:gd_test, {{id, :mended}, true})
    assert {:ok, true} = GenDurable.retry(id, engine: e)
    assert_receive {:gd, ^id, "start", %{attempt: 1}, _}, 10_000
    i = wait_status(e, id, :completed)
    assert Enum.map(i.errors, & &1["kind"]) == ["discard", "retry"]

    # Completed: not retried. Unknown: an error.
    assert {:ok, false} = GenDurable.retry(id, engine: e)
    assert {:error, %Error{kind: :not_found}} = GenDurable.retry(-1, engine: e)
  end

  test "an executing instance is not deleted" do
    e = start_engine(workflows: [Steps])
    t = register()
    id = GenDurable.insert!(Steps, state: %{"test" => t, "mode" => "block"}, engine: e)
    assert_receive {:gd, ^id, "start", _, step}, 10_000

    assert {:ok, false} = GenDurable.delete(id, engine: e)
    assert {:ok, %{matched: 1, changed: 0}} = GenDurable.delete_where(ids: [id], engine: e)
    assert GenDurable.get!(id, engine: e).status == :executing

    send(step, :continue)
    wait_status(e, id, :completed)
    assert {:ok, true} = GenDurable.delete(id, engine: e)
    assert {:error, %Error{kind: :not_found}} = GenDurable.get(id, engine: e)
    assert {:error, %Error{kind: :not_found}} = GenDurable.delete(id, engine: e)
  end
end

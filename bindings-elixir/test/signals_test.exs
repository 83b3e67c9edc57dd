defmodule GenDurable.SignalsTest do
  # Durable signals: `send/4` keeps a signal for an instance that does not
  # await yet and delivers it once, in order, when it awaits its name;
  # `signal/3` with `:ttl` keeps a signal that woke nobody for the first
  # instance that awaits it.
  use ExUnit.Case, async: true
  import GenDurable.TestHelper

  alias GenDurable.Error
  alias GenDurableTest.Mailbox

  setup do
    %{engine: start_engine(workflows: [Mailbox])}
  end

  defp mailbox(e, state),
    do: GenDurable.insert!(Mailbox, state: Map.merge(%{"got" => []}, state), engine: e)

  test "signals sent before the await are kept and delivered once, in order", %{engine: e} do
    t = register()
    id = mailbox(e, %{"test" => t, "left" => 2, "hold" => true, "on" => "go"})
    assert_receive {:gd, ^id, "start", _, step}, 10_000

    # While its first step runs: two for it, and one it never awaits.
    for {name, n} <- [{"go", 1}, {"other", 0}, {"go", 2}] do
      assert {:ok, :kept} = GenDurable.send(id, name, %{"n" => n}, engine: e)
    end

    send(step, :continue)
    i = wait_status(e, id, :completed)
    assert i.state["got"] == [["go", %{"n" => 1}], ["go", %{"n" => 2}]]

    # Woken once per signal: the start, then one step per await.
    assert_receive {:gd, ^id, "again", %{wake: {:signal, "go", %{"n" => 1}}}, _}
    assert_receive {:gd, ^id, "again", %{wake: {:signal, "go", %{"n" => 2}}}, _}
    refute_received {:gd, ^id, _, _, _}

    assert {:ok, {:finished, :completed}} = GenDurable.send(id, "go", %{}, engine: e)
  end

  test "a signal to an awaiting instance wakes it", %{engine: e} do
    t = register()
    id = mailbox(e, %{"test" => t, "left" => 1, "on" => "approve"})
    assert_receive {:gd, ^id, "start", _, _}, 10_000
    wait_status(e, id, :awaiting)

    assert {:ok, :woken} = GenDurable.send(id, "approve", %{"by" => "ann"}, engine: e)
    i = wait_status(e, id, :completed)
    assert i.state["got"] == [["approve", %{"by" => "ann"}]]
  end

  test "a signal by name with a ttl waits for the first awaiter, once", %{engine: e} do
    name = "rates:#{unique()}"
    assert {:ok, 0} = GenDurable.signal(name, %{"day" => 1}, ttl: 600_000, engine: e)

    first = mailbox(e, %{"left" => 1, "on" => name})
    i = wait_status(e, first, :completed)
    assert i.state["got"] == [[name, %{"day" => 1}]]

    # Delivered: the next awaiter waits for a signal of its own.
    second = mailbox(e, %{"left" => 1, "on" => name})
    wait_status(e, second, :awaiting)
    assert {:ok, 1} = GenDurable.signal(name, %{"day" => 2}, engine: e)
    assert wait_status(e, second, :completed).state["got"] == [[name, %{"day" => 2}]]
  end

  test "a signal by name without a ttl is not kept", %{engine: e} do
    name = "broadcast:#{unique()}"
    assert {:ok, 0} = GenDurable.signal(name, %{}, engine: e)

    id = mailbox(e, %{"left" => 1, "on" => name})
    wait_status(e, id, :awaiting)
    assert {:ok, 1} = GenDurable.signal(name, %{"late" => true}, engine: e)
    assert wait_status(e, id, :completed).state["got"] == [[name, %{"late" => true}]]
  end

  test "errors", %{engine: e} do
    assert {:error, %Error{kind: :not_found}} = GenDurable.send(-1, "go", %{}, engine: e)

    assert {:error, %Error{kind: :invalid_input, field: :id}} =
             GenDurable.send("1", "go", %{}, engine: e)

    assert {:error, %Error{field: :signal}} = GenDurable.send(1, 5, %{}, engine: e)

    assert {:error, %Error{kind: :invalid_input, field: :payload}} =
             GenDurable.send(1, "go", %{"pid" => self()}, engine: e)

    assert {:error, %Error{kind: :invalid_input, field: :ttl, message: m}} =
             GenDurable.signal("x", %{}, ttl: 0, engine: e)

    assert m =~ "must be longer than zero"

    assert {:error,
            %Error{field: :ttl, message: "invalid ttl: must be positive milliseconds" <> _}} =
             GenDurable.signal("x", %{}, ttl: :soon, engine: e)

    assert_raise Error, fn -> GenDurable.send!(-1, "go", %{}, engine: e) end
  end
end

defmodule GenDurable.TestingTest do
  # GenDurable.Testing as an application's tests use it: the engine named
  # GenDurable (Shop inserts through it), started without queues, drained by
  # the test.
  use ExUnit.Case, async: true
  use GenDurable.Testing
  import GenDurable.TestHelper, only: [engine_opts: 1]

  alias GenDurable.{Error, Instance}
  alias GenDurableTest.Steps

  @zero %{
    steps: 0,
    completed: 0,
    discarded: 0,
    cancelled: 0,
    retried: 0,
    snoozed: 0,
    awaiting: 0
  }

  defp start(opts \\ []) do
    start_supervised!(
      {GenDurable,
       engine_opts(
         [name: GenDurable, queues: [], workflows: [Shop.Order, Shop.Receipt, Steps]] ++
           opts
       )}
    )

    :ok
  end

  describe "an application's test" do
    setup do: start()

    test "inserts, drains and asserts" do
      {:ok, id} = Shop.place_order(1, "ann@example.com")

      assert [%Instance{id: ^id, status: :available}] =
               assert_inserted(Shop.Order, state: %{order: 1})

      refute_inserted(Shop.Receipt)

      assert drain_queue(:default) == %{@zero | steps: 2, completed: 1}
      assert_inserted(Shop.Order, state: %{order: 1, charged: true}, status: :completed)

      # The receipt waits in its own queue.
      assert_inserted(Shop.Receipt, state: %{order: 1}, queue: "mailers", status: :available)
      assert drain_queue("mailers") == %{@zero | steps: 1, completed: 1}
      assert [receipt] = assert_inserted(Shop.Receipt, state: %{sent: true}, status: :completed)
      assert receipt.state == %{"order" => 1, "email" => "ann@example.com", "sent" => true}

      assert drain_queue(:default) == @zero
      assert [_] = inserted(Shop.Order)
      assert inserted(Shop.Order, status: :discarded) == []
    end

    test "a failed assertion lists what was found" do
      e = assert_raise ExUnit.AssertionError, fn -> assert_inserted(Shop.Order) end

      assert e.message ==
               ~s(Expected an instance of "Shop.Order", found none.\n) <>
                 ~s(There are no instances of "Shop.Order".)

      {:ok, id} = Shop.place_order(1, "ann@example.com")

      e =
        assert_raise ExUnit.AssertionError, fn ->
          assert_inserted(Shop.Order, state: %{order: 2}, status: :available)
        end

      assert e.message ==
               ~s(Expected an instance of "Shop.Order" with state: %{order: 2}, ) <>
                 ~s(status: :available, found none.\n) <>
                 ~s[Instances of "Shop.Order" (oldest first, at most 20):\n] <>
                 ~s(  ##{id} available in "default" at step "start", ) <>
                 ~s(state: %{"email" => "ann@example.com", "order" => 1})

      e = assert_raise ExUnit.AssertionError, fn -> refute_inserted(Shop.Order) end
      assert e.message =~ ~s(Expected no instance of "Shop.Order", found 1:\n  ##{id} available)
    end

    test "retries, snoozes and awaits" do
      {:ok, flaky} = GenDurable.insert(Steps, state: %{mode: "flaky"})

      # The retry waits out its backoff, unless scheduled instances run too.
      assert drain_queue(:default) == %{@zero | steps: 1, retried: 1}

      assert drain_queue(:default, with_scheduled: true) ==
               %{@zero | steps: 2, retried: 1, completed: 1}

      assert [%{id: ^flaky, state: %{"attempt" => 3}}] = inserted(Steps, status: :completed)

      {:ok, _} = GenDurable.insert(Steps, state: %{mode: "snooze"})

      assert drain_queue(:default, with_scheduled: true) == %{
               @zero
               | steps: 2,
                 snoozed: 1,
                 completed: 1
             }

      signal = "approve:#{System.unique_integer([:positive])}"
      {:ok, waiting} = GenDurable.insert(Steps, state: %{mode: "await_signal", signal: signal})
      assert drain_queue(:default) == %{@zero | steps: 1, awaiting: 1}
      assert_inserted(Steps, state: %{signal: signal}, status: :awaiting)
      assert {:ok, :woken} = GenDurable.send(waiting, signal, %{"ok" => true})
      assert drain_queue(:default) == %{@zero | steps: 1, completed: 1}
    end

    test "max_steps stops the drain" do
      {:ok, _} = GenDurable.insert_all(for _ <- 1..3, do: {Steps, state: %{mode: "next_done"}})
      first = drain_queue(:default, max_steps: 4)
      rest = drain_queue(:default)
      assert {first.steps, rest.steps, first.completed + rest.completed} == {4, 2, 3}
    end

    test "options are checked" do
      for {call, field} <- [
            {fn -> drain_queue(:default, bogus: 1) end, :options},
            {fn -> drain_queue(:default, with_scheduled: :yes) end, :with_scheduled},
            {fn -> drain_queue(:default, max_steps: 0) end, :max_steps},
            {fn -> drain_queue(nil) end, :queue},
            {fn -> inserted(Shop.Order, status: :done) end, :status},
            {fn -> inserted(Shop.Order, status: "done") end, :status},
            {fn -> inserted(Shop.Order, state: [1]) end, :state},
            {fn -> inserted(Shop.Order, limit: -1) end, :limit}
          ] do
        assert %Error{kind: :invalid_input, field: ^field} = assert_raise(Error, call)
      end

      assert %Error{kind: :not_running} =
               assert_raise(Error, fn -> drain_queue(:default, engine: :nope) end)
    end
  end

  test "inline: every insert runs its queues to the end before it returns" do
    start(inline: true)

    {:ok, id} = Shop.place_order(2, "bob@example.com")
    assert {:ok, %Instance{status: :completed}} = GenDurable.get(id)
    # The receipt was inserted by a step, and run within that insert.
    assert_inserted(Shop.Receipt, state: %{order: 2, sent: true}, status: :completed)
  end

  test "inline takes a boolean" do
    Process.flag(:trap_exit, true)

    assert {:error, %Error{kind: :invalid_config, message: m}} =
             GenDurable.start_link(engine_opts(inline: 5))

    assert m == "invalid configuration: engine option inline: expected true or false, got 5"
  end

  defmodule OtherEngine do
    use GenDurable.Testing, engine: :gd_testing_other
  end

  test "use GenDurable.Testing, engine: name" do
    start_supervised!(
      {GenDurable, engine_opts(name: :gd_testing_other, queues: [], workflows: [Steps])}
    )

    {:ok, id} = GenDurable.insert(Steps, state: %{mode: "cancel"}, engine: :gd_testing_other)
    assert OtherEngine.drain_queue(:default) == %{@zero | steps: 1, cancelled: 1}
    assert [%{id: ^id}] = OtherEngine.assert_inserted(Steps, status: :cancelled)
    OtherEngine.refute_inserted(Steps, status: :completed)
  end
end

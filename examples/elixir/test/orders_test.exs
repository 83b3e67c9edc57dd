defmodule Orders.PaymentTest do
  # How an application tests its workflows with GenDurable.Testing: the
  # engine runs no queues, and each test drains them itself.
  use ExUnit.Case
  use GenDurable.Testing

  setup do
    # A schema of its own for each test: it starts empty.
    schema = "orders_test_#{System.os_time(:millisecond)}_#{System.unique_integer([:positive])}"

    start_supervised!(
      {GenDurable,
       url: Application.fetch_env!(:orders, :database_url),
       schema: schema,
       workflows: [Orders.Payment, Orders.Refund]}
    )

    :ok
  end

  test "a payment waits for the provider's webhook" do
    {:ok, id} = GenDurable.insert(Orders.Payment, state: %{order: 7})
    assert_inserted(Orders.Payment, state: %{order: 7}, status: :available)

    # It asks for the charge and awaits the webhook.
    assert %{steps: 1, awaiting: 1} = drain_queue(:default)
    assert_inserted(Orders.Payment, state: %{order: 7}, status: :awaiting)

    {:ok, :woken} = GenDurable.send(id, "paid", %{"charge" => "ch_7"})
    assert %{steps: 1, completed: 1} = drain_queue(:default)
    assert_inserted(Orders.Payment, state: %{order: 7, charge: "ch_7"}, status: :completed)
  end

  test "a refund webhook delivered twice refunds once" do
    for _ <- 1..2 do
      {:ok, _} =
        GenDurable.insert(Orders.Refund,
          state: %{order: 8, amount: 500},
          idempotency_key: "refund:8"
        )
    end

    assert [_one] = inserted(Orders.Refund, state: %{order: 8})
    assert %{completed: 1} = drain_queue(:default)
    refute_inserted(Orders.Refund, status: :available)
  end
end

defmodule Orders.InlineTest do
  # Inline mode: every insert runs its queues to the end before it returns.
  use ExUnit.Case
  use GenDurable.Testing

  test "a refund is done when its insert returns" do
    start_supervised!(
      {GenDurable,
       url: Application.fetch_env!(:orders, :database_url),
       schema: "orders_inline_#{System.os_time(:millisecond)}",
       inline: true,
       workflows: [Orders.Refund]}
    )

    {:ok, id} = GenDurable.insert(Orders.Refund, state: %{order: 9, amount: 100})
    assert {:ok, %GenDurable.Instance{status: :completed}} = GenDurable.get(id)
    assert_inserted(Orders.Refund, state: %{order: 9, refunded: true})
  end
end

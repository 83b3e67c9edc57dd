defmodule Orders.Refund do
  @moduledoc """
  Refunds an order. Inserted from a payment provider's webhook, which may be
  delivered more than once: the insert carries the idempotency key
  `"refund:<order>"`, so each order is refunded once however often the
  webhook arrives.
  """
  use GenDurable

  @impl true
  def handle_step("start", %{"order" => order, "amount" => amount} = state, _ctx) do
    IO.puts("order #{order}: refunding #{amount}")
    {:done, Map.put(state, "refunded", true)}
  end
end

defmodule Orders.Reminder do
  @moduledoc "Reminds a customer of an unpaid order: at most once an hour per customer."
  use GenDurable

  @impl true
  def handle_step("start", %{"customer" => customer} = state, _ctx) do
    IO.puts("customer #{customer}: reminder sent")
    {:done, state}
  end
end

defmodule Orders.Idempotent do
  @moduledoc """
  Runs the idempotent-insert example: `mix run -e Orders.Idempotent.main`.

  Uses `DATABASE_URL`, or starts a throwaway PostgreSQL.
  """

  def main do
    {:ok, url, pg} = GenDurable.TempPostgres.url_or_start()

    children = [
      {GenDurable,
       url: url,
       schema: "orders_idempotent",
       queues: [default: 5],
       poll_interval: 200,
       workflows: [Orders.Refund, Orders.Reminder]}
    ]

    {:ok, sup} = Supervisor.start_link(children, strategy: :one_for_one)

    # The same webhook, delivered three times (a retry after a timeout, say),
    # two of them at once: one refund.
    deliveries =
      [fn -> webhook(7, 1_200) end, fn -> webhook(7, 1_200) end]
      |> Enum.map(&Task.async/1)
      |> Task.await_many()

    [%{id: id} | _] = deliveries
    true = Enum.all?(deliveries, &(&1.id == id))
    1 = Enum.count(deliveries, &(not &1.conflict?))

    wait(id, :completed)

    # Completed instances keep their key (the default statuses include
    # :completed): a late delivery is still told about the refund done.
    %{id: ^id, conflict?: true} = webhook(7, 1_200)
    IO.puts("refund of order 7: instance #{id}, inserted once for three deliveries")

    # One reminder per customer per hour, whatever else the state holds:
    # the identity is the workflow and the state's "customer" field, in
    # fixed one-hour windows.
    {:ok, reminders} =
      GenDurable.insert_all(
        for {customer, order} <- [{3, 10}, {3, 11}, {4, 12}] do
          {Orders.Reminder,
           state: %{customer: customer, order: order},
           unique: [fields: [:customer], period: 3_600_000]}
        end
      )

    [%{conflict?: false, id: r3}, %{conflict?: true, id: r3}, %{conflict?: false, id: r4}] =
      reminders

    IO.puts("reminders: #{inspect(reminders)}")
    wait(r3, :completed)
    wait(r4, :completed)

    Supervisor.stop(sup)
    if pg, do: GenDurable.TempPostgres.stop(pg)
  end

  # What a webhook handler does: insert the refund under the order's key
  # and answer the provider either way.
  defp webhook(order, amount) do
    {:ok, %{id: id, conflict?: conflict?} = inserted} =
      GenDurable.insert(Orders.Refund,
        state: %{order: order, amount: amount},
        idempotency_key: "refund:#{order}"
      )

    IO.puts("webhook for order #{order}: instance #{id}#{if conflict?, do: " (already there)"}")
    inserted
  end

  # Polls until the instance has `status`; gives up after a minute.
  defp wait(id, status, deadline \\ System.monotonic_time(:millisecond) + 60_000) do
    cond do
      match?({:ok, %{status: ^status}}, GenDurable.get(id)) ->
        :ok

      System.monotonic_time(:millisecond) > deadline ->
        raise "instance #{id} did not reach #{status} within 60 s"

      true ->
        Process.sleep(100)
        wait(id, status, deadline)
    end
  end
end

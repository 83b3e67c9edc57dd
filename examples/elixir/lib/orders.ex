defmodule Orders.Fulfil do
  @moduledoc """
  Fulfils an order: charge the card (one charge at a time per customer, at
  most 3 at once per payment provider account), wait for the warehouse to
  confirm the parcel left, then e-mail the customer.
  """
  use GenDurable

  @impl true
  def handle_step("charge", %{"order" => order} = state, ctx) do
    # The instance was inserted holding the key "customer:<id>": no other
    # step of this customer runs until we let it go.
    IO.puts("order #{order}: charging (attempt #{ctx.attempt}, key #{ctx.concurrency_key})")

    case GenDurable.Bulkhead.call(:card_api, fn -> Orders.CardApi.charge(order) end) do
      {GenDurable.Bulkhead, :saturated} ->
        # Backpressure from our own bulkhead: try again shortly.
        {:snooze, 100}

      {:ok, charge_id} ->
        {:next, "ship", Map.put(state, "charge", charge_id),
         concurrency_key: {:warehouse, state["warehouse"]}}

      {:error, reason} ->
        {:error, reason}
    end
  end

  def handle_step("ship", %{"order" => order} = state, _ctx) do
    IO.puts("order #{order}: waiting for the warehouse")
    # Parked without holding the warehouse key; a day at most.
    {:await, "notify", state, signal: "shipped:#{order}", timeout: 86_400_000}
  end

  def handle_step("notify", %{"order" => order} = state, ctx) do
    case ctx.wake do
      {:signal, _, %{"tracking" => tracking}} ->
        IO.puts("order #{order}: shipped with #{tracking}, e-mailing the customer")
        {:done, Map.put(state, "tracking", tracking)}

      :timeout ->
        {:cancel, "the parcel never left"}
    end
  end
end

defmodule Orders.CardApi do
  @moduledoc "A stand-in for a card payment API that fails now and then."
  def charge(order) do
    Process.sleep(20)

    if rem(order, 4) == 0 and :rand.uniform(2) == 1,
      do: {:error, "card declined, try again"},
      else: {:ok, "ch_#{order}"}
  end
end

defmodule Orders do
  @moduledoc """
  Runs the example: `mix run -e Orders.main`.

  Uses `DATABASE_URL`, or starts a throwaway PostgreSQL.
  """

  def main do
    {:ok, url, pg} = GenDurable.TempPostgres.url_or_start()
    :ok = GenDurable.Bulkhead.configure(:card_api, limit: 5, reclaim_after: 30_000)

    children = [
      {GenDurable,
       url: url,
       schema: "orders_example",
       queues: [default: 10],
       concurrency_limits: [warehouse: [limit: 3]],
       poll_interval: 200,
       backoff: [base: 100, max: 1_000],
       workflows: [Orders.Fulfil]}
    ]

    {:ok, sup} = Supervisor.start_link(children, strategy: :one_for_one)

    {:ok, ids} =
      GenDurable.insert_all(
        for order <- 1..8 do
          {Orders.Fulfil,
           step: "charge",
           state: %{order: order, warehouse: rem(order, 2)},
           concurrency_key: {:customer, rem(order, 3)}}
        end
      )

    # Wait until every order is parked, then let the warehouse confirm them.
    wait(ids, :awaiting)

    for order <- 1..8 do
      {:ok, 1} = GenDurable.signal("shipped:#{order}", %{tracking: "TRK#{1000 + order}"})
    end

    wait(ids, :completed)

    for id <- ids do
      {:ok, i} = GenDurable.get(id)
      IO.puts("instance #{id}: #{i.status}, #{inspect(i.state)}")
    end

    Supervisor.stop(sup)
    if pg, do: GenDurable.TempPostgres.stop(pg)
  end

  # Polls until every instance has `status`; gives up after a minute.
  defp wait(ids, status, deadline \\ System.monotonic_time(:millisecond) + 60_000) do
    cond do
      Enum.all?(ids, fn id -> match?({:ok, %{status: ^status}}, GenDurable.get(id)) end) ->
        :ok

      System.monotonic_time(:millisecond) > deadline ->
        raise "the instances did not all reach #{status} within 60 s"

      true ->
        Process.sleep(100)
        wait(ids, status, deadline)
    end
  end
end

defmodule Orders.Digest do
  @moduledoc """
  A sales digest, inserted by a cron entry at every tick of its schedule
  (every two seconds in this example; `"0 6 * * *"` for a daily one).
  """
  use GenDurable

  @impl true
  def handle_step("start", state, ctx) do
    IO.puts("digest #{state["report"]}: instance #{ctx.id}")
    Orders.Periodic.tell({:digest, ctx.id})
    {:done, state}
  end
end

defmodule Orders.Capture do
  @moduledoc """
  Captures a payment at the provider. A capture that hangs is killed after
  a second (its own timeout; the workflow's other steps get 30 s), recorded
  as a timeout and retried; here it has one attempt.
  """
  use GenDurable, timeout: 30_000, step_timeouts: %{"capture" => 1_000}, max_attempts: 1

  @impl true
  def handle_step("start", state, _ctx), do: {:next, "capture", state}

  def handle_step("capture", %{"order" => order}, _ctx) do
    IO.puts("order #{order}: capturing (the provider does not answer)")
    Orders.Periodic.tell({:capturing, self()})
    Process.sleep(:infinity)
  end
end

defmodule Orders.Payment do
  @moduledoc """
  Asks the payment provider for a charge, then awaits the provider's
  webhook, the signal `"paid"` sent to this instance. The webhook may come
  before the step that awaits it has even returned: the signal is kept and
  delivered when the instance awaits it.
  """
  use GenDurable

  @impl true
  def handle_step("start", %{"order" => order} = state, ctx) do
    IO.puts("order #{order}: charge requested")
    # In the example, the provider's webhook comes right now, while this
    # step still runs.
    Orders.Periodic.provider(ctx.id)
    {:await, "confirmed", state, signal: "paid", timeout: 3_600_000}
  end

  def handle_step("confirmed", %{"order" => order} = state, ctx) do
    case ctx.wake do
      {:signal, "paid", %{"charge" => charge}} ->
        IO.puts("order #{order}: paid with #{charge}")
        {:done, Map.put(state, "charge", charge)}

      :timeout ->
        {:cancel, "never paid"}
    end
  end
end

defmodule Orders.Periodic do
  @moduledoc """
  Runs the example of periodic workflows, step timeouts and signals:
  `mix run -e Orders.Periodic.main`.

  Uses `DATABASE_URL`, or starts a throwaway PostgreSQL.
  """

  @name :orders_periodic

  @doc false
  # Steps report to the example's main process, when it runs.
  def tell(message) do
    case Process.whereis(@name) do
      nil -> :ok
      pid -> send(pid, message)
    end
  end

  @doc false
  # Plays the payment provider, when the example's main process runs: it
  # sends the webhook's signal while the step that asked is still running,
  # then lets that step go on.
  def provider(id) do
    case Process.whereis(@name) do
      nil ->
        :ok

      pid ->
        send(pid, {:charge_requested, id, self()})

        receive do
          :go -> :ok
        end
    end
  end

  def main do
    {:ok, url, pg} = GenDurable.TempPostgres.url_or_start()
    Process.register(self(), @name)

    children = [
      {
        GenDurable,
        # Six fields, seconds first: every two seconds. Each tick is
        # inserted once, however many nodes run this entry.
        url: url,
        schema: "orders_periodic",
        queues: [default: 5],
        poll_interval: 200,
        workflows: [Orders.Digest, Orders.Capture, Orders.Payment],
        cron: [
          {"*/2 * * * * *", Orders.Digest,
           state: %{"report" => "sales"}, name: "sales-digest", missed: :skip}
        ]
      }
    ]

    {:ok, sup} = Supervisor.start_link(children, strategy: :one_for_one)

    # Two ticks of the digest.
    for _ <- 1..2 do
      receive do
        {:digest, _id} -> :ok
      after
        10_000 -> raise "no digest within 10 s"
      end
    end

    IO.puts("cron: two digests inserted and run")

    # A capture that hangs: its process is killed at its timeout.
    {:ok, capture} = GenDurable.insert(Orders.Capture, state: %{order: 41})

    pid =
      receive do
        {:capturing, pid} -> pid
      end

    ref = Process.monitor(pid)

    receive do
      {:DOWN, ^ref, :process, ^pid, reason} ->
        IO.puts("order 41: the capture's process ended: #{inspect(reason)}")
    end

    %{status: :discarded, errors: [%{"kind" => "timeout", "message" => message}]} =
      wait(capture, :discarded)

    IO.puts("order 41: discarded (#{message})")

    # The provider's webhook arrives before the workflow awaits it.
    {:ok, payment} = GenDurable.insert(Orders.Payment, state: %{order: 42})

    step =
      receive do
        {:charge_requested, ^payment, step} -> step
      end

    {:ok, :kept} = GenDurable.send(payment, "paid", %{"charge" => "ch_42"})
    IO.puts("order 42: webhook received before the await: the signal is kept")
    send(step, :go)

    %{state: %{"charge" => "ch_42"}} = wait(payment, :completed)

    Supervisor.stop(sup)
    if pg, do: GenDurable.TempPostgres.stop(pg)
  end

  # Polls until the instance has `status`; gives up after a minute.
  defp wait(id, status, deadline \\ System.monotonic_time(:millisecond) + 60_000) do
    {:ok, i} = GenDurable.get(id)

    cond do
      i.status == status ->
        i

      System.monotonic_time(:millisecond) > deadline ->
        raise "instance #{id} did not reach #{status} within 60 s"

      true ->
        Process.sleep(100)
        wait(id, status, deadline)
    end
  end
end

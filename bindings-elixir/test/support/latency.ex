defmodule GenDurableTest.Latency do
  @moduledoc false
  # Measures how late processes on the normal schedulers get to run while
  # large values cross the NIF. Run in a VM of its own (see
  # test/scheduler_latency_test.exs).

  @tick 10
  @held 20

  @doc """
  Starts an engine on `url` and `schema`, measures the worst lateness with
  nothing crossing the NIF, then crosses it with large values (a 100 000-key
  state inserted and read, a step returning a 3 000 000-element list, read
  back, a 1 000 000-element signal payload handed to a step) while tickers
  run, up to `runs` times or until a run's worst lateness is under `bound`
  ms. Returns the baseline and, for each run, its worst lateness, the
  processes that held a scheduler (see `measure/1`) and whether the values
  came back whole.
  """
  def run(url, schema, bound, runs) do
    {:ok, sup} =
      GenDurable.start_link(
        name: :latency,
        url: url,
        schema: schema,
        queues: [default: 4],
        workflows: [GenDurableTest.Big]
      )

    # Built before the tickers start: building them is not what is measured.
    wide = Map.new(1..100_000, &{"k#{&1}", &1})
    payload = Enum.to_list(1..1_000_000)

    {baseline, _, _} = measure(fn -> Process.sleep(1_000) end)

    results =
      Enum.reduce_while(1..runs, [], fn n, acc ->
        r = cross(wide, payload, "big:#{n}")
        if r.worst < bound, do: {:halt, [r | acc]}, else: {:cont, [r | acc]}
      end)

    Supervisor.stop(sup)
    %{baseline: baseline, runs: Enum.reverse(results)}
  end

  defp cross(wide, payload, signal) do
    {worst, {wide_back, list_back, signalled}, held} =
      measure(fn ->
        {:ok, wide_id} = insert(state: wide, schedule_in: 3_600_000)
        {:ok, wide_back} = GenDurable.get(wide_id, engine: :latency)

        {:ok, list_id} = insert(state: %{"list" => 3_000_000})
        list_back = await_status(list_id, :completed)

        {:ok, signal_id} = insert(state: %{"signal" => signal})
        await_status(signal_id, :awaiting)
        {:ok, 1} = GenDurable.signal(signal, payload, engine: :latency)
        signalled = await_status(signal_id, :completed)

        {wide_back.state, list_back.state, signalled.state}
      end)

    %{
      worst: worst,
      held: held,
      whole:
        wide_back == wide and length(list_back["list"]) == 3_000_000 and
          signalled["length"] == 1_000_000
    }
  end

  defp insert(opts), do: GenDurable.insert(GenDurableTest.Big, [engine: :latency] ++ opts)

  # Polls slowly: every read converts the values.
  defp await_status(id, status) do
    {:ok, i} = GenDurable.get(id, engine: :latency)

    if i.status == status do
      i
    else
      Process.sleep(200)
      await_status(id, status)
    end
  end

  @doc """
  Runs `fun` while a high-priority ticker bound to each normal scheduler
  wakes every #{@tick} ms; returns the worst lateness of a wake-up in ms,
  the result, and the processes the VM saw run for #{@held} ms or more
  without giving their scheduler back (`{ms, function}`: what holds a
  scheduler, as opposed to the machine not running the VM's threads).
  """
  def measure(fun) do
    parent = self()
    monitor = spawn(fn -> held([]) end)
    :erlang.system_monitor(monitor, [{:long_schedule, @held}])

    tickers =
      for n <- 1..System.schedulers_online() do
        spawn_ticker(n, fn -> tick(parent, now() + @tick, 0) end)
      end

    result = fun.()

    worst =
      for pid <- tickers do
        send(pid, :stop)

        receive do
          {:worst, ^pid, worst} -> worst
        end
      end

    :erlang.system_monitor(:undefined)
    send(monitor, {:stop, parent})

    receive do
      {:held, ^monitor, held} -> {Enum.max(worst), result, held}
    end
  end

  defp held(acc) do
    receive do
      {:monitor, _pid, :long_schedule, info} ->
        held([{info[:timeout], info[:in]} | acc])

      {:stop, parent} ->
        send(parent, {:held, self(), Enum.reverse(acc)})
    end
  end

  # Bound to scheduler `n`, so that it cannot move to another scheduler when
  # its own is blocked (an option of spawn_opt the VM accepts but does not
  # document); unbound where it is refused.
  defp spawn_ticker(n, fun) do
    :erlang.spawn_opt(fun, [{:scheduler, n}, {:priority, :high}])
  rescue
    ArgumentError -> :erlang.spawn_opt(fun, [{:priority, :high}])
  end

  defp tick(parent, due, worst) do
    receive do
      :stop -> send(parent, {:worst, self(), worst})
    after
      max(due - now(), 0) ->
        late = now() - due
        tick(parent, now() + @tick, max(worst, late))
    end
  end

  defp now, do: System.monotonic_time(:millisecond)
end

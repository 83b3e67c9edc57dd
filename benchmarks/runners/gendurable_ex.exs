# gendurable through its Elixir binding: the same engine as the Rust runner,
# with the jobs written as an Elixir workflow (each step runs in a supervised
# process). W2 keys are K = 1 concurrency keys, W3 one key of a gate with
# limit 10. W5: the gate is the key "api:1" under the gate "api" (limit 10),
# the key the K = 1 key "acct:1", the rate the rate-limit key "rl:1" (50/s,
# burst 5).
# Run by the harness as
#   elixir -pa <gen_durable ebin> gendurable_ex.exs <w1|w2|w3|w4> --concurrency 20 --jobs N --record FILE
#   elixir -pa <gen_durable ebin> gendurable_ex.exs w5 --concurrency 20 --jobs N --backlog B --hold S --record FILE

defmodule Bench.Job do
  use GenDurable

  # Each job's start and end go into two preallocated `:atomics` slots by
  # its index, as cheap as the Rust runner's push onto a vector (an ETS
  # insert into a table that grows to every job cost about 1.4 us a step,
  # 6 % of the BEAM's CPU on W1). The key is the one the job was inserted
  # with (`new/2`), written out with the records.
  @impl true
  def handle_step(_step, %{"i" => i} = state, _ctx) do
    start = System.os_time(:nanosecond)
    pause = :persistent_term.get(:bench_pause)
    if pause > 0, do: sleep_exactly(pause)
    times = :persistent_term.get(:bench_times)
    :atomics.put(times, 2 * i + 1, start)
    :atomics.put(times, 2 * i + 2, System.os_time(:nanosecond))
    :counters.add(:persistent_term.get(:bench_done), 1, 1)
    {:done, state}
  end

  # The pause as precise as the Rust and Python runners' (a thread sleeping
  # to a deadline, about 5.1-5.2 ms for 5): the BEAM's timers count whole
  # milliseconds and round up, so `Process.sleep(5)` lasts 5.86 ms on
  # average, which alone caps W2's 20 slots at 3,410 jobs/s. The deadline
  # is fixed in the NIF and one of the engine runtime's blocking threads
  # sleeps to it, as in the Rust runner's `sleep_exactly`
  # (cli/src/workload.rs); this process waits in `receive`.
  defp sleep_exactly(ms) do
    :ok = GenDurable.Native.call(&GenDurable.Native.bench_sleep(ms * 1000, &1))
  end
end

defmodule Bench.W5Job do
  use GenDurable

  # W5: the kind follows from the key the step holds or the rate limit it was
  # admitted under. A start is kept when the step starts, so that a step still
  # running when the worker stops is recorded too.
  @impl true
  def handle_step(_step, state, ctx) do
    kind =
      case {ctx.concurrency_key, ctx.rate_limit} do
        {"api:1", _} -> "gate"
        {"acct:1", _} -> "key"
        {nil, nil} -> "free"
        {nil, _} -> "rate"
      end

    i = :erlang.unique_integer([:positive])
    start = System.os_time(:nanosecond)

    if kind in ["gate", "key"] do
      :ets.insert(:bench_spans, {i, kind, start, nil})
      Process.sleep(1000)
    end

    # A no-op step ends before the worker stops: one insert, at its end.
    :ets.insert(:bench_spans, {i, kind, start, System.os_time(:nanosecond)})
    if kind == "free", do: :counters.add(:persistent_term.get(:bench_done), 1, 1)
    {:done, state}
  end
end

defmodule Bench do
  @jobs %{"w1" => 20_000, "w2" => 10_000, "w3" => 2_000, "w4" => 500}
  @pause %{"w1" => 0, "w2" => 5, "w3" => 20, "w4" => 0}
  @unfinished [:scheduled, :available, :executing, :awaiting]

  def main(["w5" | rest]) do
    strict = [concurrency: :integer, jobs: :integer, record: :string, backlog: :integer, hold: :float]
    {opts, _, _} = OptionParser.parse(rest, strict: strict)
    c = Keyword.get(opts, :concurrency, 20)
    n = Keyword.get(opts, :jobs) || 20_000
    backlog = Keyword.get(opts, :backlog, 1_000_000)
    hold = Keyword.get(opts, :hold, 10.0)
    url = System.fetch_env!("DATABASE_URL")
    done = :counters.new(1, [:atomics])
    :persistent_term.put(:bench_done, done)
    :ets.new(:bench_spans, [:public, :named_table, write_concurrency: true])

    # Up to 5 rate-limited starts back to back, as in the Rust runner (cli/src/w5.rs).
    limits = [concurrency_limits: [api: [limit: 10]], rate_limits: [rl: [limit: 50, period: 1000, burst: 5]]]
    # A client-only engine inserts the backlogs, then the free rows; the worker starts afterwards.
    {:ok, client} = GenDurable.start_link([name: :client, url: url] ++ limits)

    kinds = [
      {"gate", backlog, [concurrency_key: "api:1"]},
      {"key", backlog, [concurrency_key: "acct:1"]},
      {"rate", div(backlog, 10), [rate_limit: "rl:1"]},
      {"free", n, []}
    ]

    free_ids =
      Enum.reduce(kinds, nil, fn {kind, total, opts}, range ->
        t = System.monotonic_time()

        Enum.reduce(Stream.chunk_every(1..total//1, 5000), range, fn chunk, range ->
          ids = GenDurable.insert_all!(Enum.map(chunk, fn _ -> {Bench.W5Job, [state: %{}] ++ opts} end), engine: :client)
          done_rows = List.last(chunk)

          if done_rows == total or rem(done_rows, 50_000) == 0 do
            rate = round(done_rows / seconds(t))
            IO.puts(:stderr, "insert #{String.pad_trailing(kind, 4)} #{done_rows}/#{total} (#{rate}/s)")
          end

          cond do
            kind != "free" -> range
            range == nil -> Enum.min_max(ids)
            true -> {min(elem(range, 0), Enum.min(ids)), max(elem(range, 1), Enum.max(ids))}
          end
        end)
      end)

    Supervisor.stop(client)
    psql = psql(url)

    worker = [name: :bench, url: url, queues: [default: c], workflows: [Bench.W5Job]] ++ limits

    t = System.monotonic_time()
    t0 = System.os_time(:nanosecond)
    {:ok, _} = GenDurable.start_link(worker)
    wait(fn -> :counters.get(done, 1) >= n end)
    wait(fn -> remaining(psql, free_ids) == 0 end)
    secs = seconds(t)
    IO.puts(:stderr, "w5: #{n} free jobs in #{Float.round(secs, 2)} s; holding #{hold} s")
    Process.sleep(round(hold * 1000))
    t1 = System.os_time(:nanosecond)
    Supervisor.stop(:bench)

    spans = :ets.tab2list(:bench_spans)
    last = System.os_time(:nanosecond)

    if path = opts[:record] do
      File.write!(path, for({_i, kind, s, e} <- spans, do: "#{kind},#{s},#{e || last}\n"))
    end

    per_s = fn kind ->
      Enum.count(spans, fn {_i, k, s, _e} -> k == kind and s >= t0 and s <= t1 end) / ((t1 - t0) / 1.0e9)
    end

    print(%{
      "system" => "gendurable-ex",
      "workload" => "w5",
      "jobs" => n,
      "seconds" => secs,
      "jobs_per_s" => n / secs,
      "backlog" => backlog,
      "gate_per_s" => per_s.("gate"),
      "key_per_s" => per_s.("key"),
      "rate_per_s" => per_s.("rate")
    })
  end

  def main([workload | rest]) do
    {opts, _, _} = OptionParser.parse(rest, strict: [concurrency: :integer, jobs: :integer, record: :string])
    c = Keyword.get(opts, :concurrency, 20)
    n = Keyword.get(opts, :jobs) || Map.fetch!(@jobs, workload)
    url = System.fetch_env!("DATABASE_URL")
    done = :counters.new(1, [:atomics])
    :persistent_term.put(:bench_done, done)
    :persistent_term.put(:bench_pause, Map.fetch!(@pause, workload))
    :persistent_term.put(:bench_times, :atomics.new(2 * n, signed: true))

    worker = [
      name: :bench,
      url: url,
      queues: [default: c],
      concurrency_limits: if(workload == "w3", do: [api: [limit: 10]], else: []),
      workflows: [Bench.Job]
    ]

    # The instances not finished, counted through the worker's own pool (the
    # Python runner asks over a connection it holds; a psql per poll costs a
    # process start and a connection, 90-120 ms on a loaded machine).
    finished = fn ->
      wait(fn -> :counters.get(done, 1) >= n end)
      wait(fn -> unfinished(:bench) == 0 end)
    end

    {seconds, extra} =
      if workload == "w4" do
        {:ok, _} = GenDurable.start_link(worker)
        Process.sleep(1000)
        t = System.monotonic_time()
        before = paced(n, fn i -> GenDurable.insert!(Bench.Job, state: %{"i" => i}, engine: :bench) end)
        finished.()
        {seconds(t), latencies(before)}
      else
        # A client-only engine inserts first; the worker starts afterwards.
        {:ok, client} = GenDurable.start_link(name: :client, url: url)
        t = System.monotonic_time()

        for chunk <- Enum.chunk_every(0..(n - 1), 5000) do
          GenDurable.insert_all!(Enum.map(chunk, &{Bench.Job, new(workload, &1)}), engine: :client)
        end

        insert = seconds(t)
        # The worker connects and migrates before the clock starts, as the
        # Rust and Python runners' engines do (built, then started): it starts
        # on a paused queue, and the clock runs from the resume, which wakes
        # its pickers.
        {:ok, true} = GenDurable.pause_queue("default", engine: :client)
        Supervisor.stop(client)
        {:ok, _} = GenDurable.start_link(worker)
        t = System.monotonic_time()
        {:ok, true} = GenDurable.resume_queue("default", engine: :bench)
        finished.()
        {seconds(t), if(workload == "w1", do: %{"insert_per_s" => n / insert}, else: %{})}
      end

    Supervisor.stop(:bench)
    if path = opts[:record], do: write_records(path, workload, n)

    print(
      Map.merge(
        %{"system" => "gendurable-ex", "workload" => workload, "jobs" => n, "seconds" => seconds, "jobs_per_s" => n / seconds},
        extra
      )
    )
  end

  # Elixir 1.14 has no JSON module; every value here is a string or a number.
  defp print(line), do: IO.puts("{" <> Enum.map_join(line, ", ", fn {k, v} -> ~s("#{k}": #{json(v)}) end) <> "}")

  defp new(workload, i) do
    case key(workload, i) do
      nil -> [state: %{"i" => i}]
      key -> [state: %{"i" => i}, concurrency_key: key]
    end
  end

  defp key("w2", i), do: "k:#{rem(i, 100)}"
  defp key("w3", _), do: "api:1"
  defp key(_, _), do: nil

  defp json(v) when is_binary(v), do: ~s("#{v}")
  defp json(v), do: to_string(v)

  defp seconds(t0), do: System.convert_time_unit(System.monotonic_time() - t0, :native, :microsecond) / 1.0e6

  defp wait(pred) do
    unless pred.() do
      Process.sleep(2)
      wait(pred)
    end
  end

  defp unfinished(engine) do
    {:ok, left} = GenDurable.count(status: @unfinished, engine: engine)
    left
  end

  # W5: psql counts the free rows (the last ids) not yet finished; no
  # PostgreSQL client without Hex. One psql session, fed a query a poll (a
  # psql started per poll took 30-60 ms of the clock). Both bounds of the
  # ids: on a table not analysed since the backlogs went in, `id >= first`
  # alone was planned as a scan of all 2.1 million rows.
  defp psql(url) do
    args = ["-X", "-At", "-q", "-v", "ON_ERROR_STOP=1", url]
    Port.open({:spawn_executable, System.find_executable("psql")}, [:binary, :exit_status, {:line, 4096}, args: args])
  end

  defp remaining(psql, {first, last}) do
    sql =
      "SELECT count(*) FROM gendurable.instances WHERE id BETWEEN #{first} AND #{last}" <>
        " AND status NOT IN ('completed', 'cancelled', 'discarded');\n"

    Port.command(psql, sql)

    receive do
      {^psql, {:data, {:eol, line}}} -> String.to_integer(line)
      {^psql, {:exit_status, status}} -> raise "psql ended with status #{status}"
    end
  end

  # W4: one insert every 20 ms; the time just before each insert, by index.
  defp paced(n, insert) do
    t0 = System.monotonic_time(:millisecond)

    for i <- 0..(n - 1), into: %{} do
      delay = t0 + i * 20 - System.monotonic_time(:millisecond)
      if delay > 0, do: Process.sleep(delay)
      before = System.os_time(:nanosecond)
      insert.(i)
      {i, before}
    end
  end

  # {i, start_ns, end_ns} of each job that ran.
  defp ran(n) do
    times = :persistent_term.get(:bench_times)

    for i <- 0..(n - 1),
        start = :atomics.get(times, 2 * i + 1),
        start != 0,
        do: {i, start, :atomics.get(times, 2 * i + 2)}
  end

  defp latencies(before) do
    ms =
      ran(map_size(before))
      |> Enum.map(fn {i, start, _end} -> (start - before[i]) / 1.0e6 end)
      |> Enum.sort()

    pick = fn p -> Enum.at(ms, min(trunc(length(ms) * p), length(ms) - 1)) end
    %{"p50_ms" => pick.(0.5), "p99_ms" => pick.(0.99)}
  end

  defp write_records(path, workload, n) do
    rows = for {i, s, e} <- ran(n), do: "#{key(workload, i)},#{s},#{e}\n"
    File.write!(path, rows)
  end
end

Bench.main(System.argv())

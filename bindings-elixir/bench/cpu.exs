# CPU per 1,000 no-op steps (W1's shape: all rows inserted before the worker
# starts), Elixir workers against the Rust node in the same process (the
# NIF's bench_rust_run/5), rounds alternating. Counted over the worker phase
# only: the BEAM process's user + system time and that of the PostgreSQL
# server's processes (a backend that exits is counted in its postmaster's
# children's time), from /proc, so the server must run on this machine.
# Also the context switches of the BEAM's threads, by thread name.
#
#   MIX_ENV=prod mix run bench/cpu.exs                 # N=20000 CONCURRENCY=20 ROUNDS=3
#   ONLY=ex ROUNDS=5 MIX_ENV=prod mix run bench/cpu.exs    # ONLY=rust or ex (the elixir script overwrites MODE)
#
# Uses DATABASE_URL (needs psql), or a throwaway PostgreSQL.

defmodule Bench.CpuJob do
  use GenDurable

  # As the harness's runner does: a start and an end per step, a counter.
  @impl true
  def handle_step(_step, %{"i" => i} = state, _ctx) do
    start = System.os_time(:nanosecond)
    times = :persistent_term.get(:bench_times)
    :atomics.put(times, 2 * i + 1, start)
    :atomics.put(times, 2 * i + 2, System.os_time(:nanosecond))
    :counters.add(:persistent_term.get(:bench_done), 1, 1)
    {:done, state}
  end
end

defmodule Bench.Cpu do
  def run do
    n = String.to_integer(System.get_env("N", "20000"))
    c = String.to_integer(System.get_env("CONCURRENCY", "20"))
    rounds = String.to_integer(System.get_env("ROUNDS", "3"))
    modes = if m = System.get_env("ONLY"), do: [String.to_existing_atom(m)], else: [:rust, :ex]
    {:ok, url, pg} = GenDurable.TempPostgres.url_or_start()
    :persistent_term.put(:bench_done, :counters.new(1, [:atomics]))
    :persistent_term.put(:bench_times, :atomics.new(2 * n, signed: true))
    postmaster = postmaster(url)
    IO.puts("#{n} no-op steps, concurrency #{c}, Mix env #{Mix.env()}; ms of CPU per 1,000 steps")

    results = for i <- 1..rounds, mode <- modes, do: round(mode, url, postmaster, n, c, i)

    for mode <- modes do
      rs = for {^mode, r} <- results, do: r
      med = fn k -> rs |> Enum.map(& &1[k]) |> Enum.sort() |> Enum.at(div(length(rs), 2)) end

      IO.puts(
        "#{mode} median: #{round(med.(:rate))} steps/s, BEAM #{med.(:beam)}, " <>
          "PostgreSQL #{med.(:pg)}, both #{med.(:total)}"
      )
    end

    if pg, do: GenDurable.TempPostgres.stop(pg)
  end

  defp round(mode, url, postmaster, n, c, i) do
    schema = "bench_cpu_#{System.unique_integer([:positive])}"
    {:ok, client} = GenDurable.start_link(name: :bench_client, url: url, schema: schema)
    wf = if mode == :ex, do: Bench.CpuJob, else: "Bench.RustNoop"

    for chunk <- Enum.chunk_every(0..(n - 1), 5000) do
      GenDurable.insert_all!(Enum.map(chunk, &{wf, [state: %{"i" => &1}]}), engine: :bench_client)
    end

    Supervisor.stop(client)
    :counters.put(:persistent_term.get(:bench_done), 1, 0)
    Process.sleep(300)
    {sw0, cpu0, pg0} = {switches(), ticks(System.pid()), pg_ticks(postmaster)}
    t = System.monotonic_time()

    case mode do
      :ex ->
        opts = [
          name: :bench_worker,
          url: url,
          schema: schema,
          queues: [default: c],
          workflows: [Bench.CpuJob]
        ]

        {:ok, _} = GenDurable.start_link(opts)
        wait(fn -> :counters.get(:persistent_term.get(:bench_done), 1) >= n end)
        Supervisor.stop(:bench_worker)

      :rust ->
        {:ok, _} =
          GenDurable.Native.call(&GenDurable.Native.bench_rust_run(url, schema, n, c, &1))
    end

    secs = System.convert_time_unit(System.monotonic_time() - t, :native, :microsecond) / 1.0e6
    {sw1, cpu1, pg1} = {switches(), ticks(System.pid()), pg_ticks(postmaster)}
    # Ticks of 10 ms, per 1,000 steps.
    per_k = fn ticks -> Float.round(ticks * 10 * 1000 / n, 1) end
    pg = Enum.reduce(pg1, 0, fn {p, t}, acc -> acc + t - Map.get(pg0, p, 0) end)

    r = %{
      rate: n / secs,
      beam: per_k.(cpu1 - cpu0),
      pg: per_k.(pg),
      total: per_k.(cpu1 - cpu0 + pg)
    }

    sw =
      for {k, v} <- sw1,
          d = v - Map.get(sw0, k, 0),
          d > n / 100,
          do: "#{k} #{round(d * 1000 / n)}"

    IO.puts(
      "#{mode} round #{i}: #{round(r.rate)} steps/s, BEAM #{r.beam}, PostgreSQL #{r.pg}, " <>
        "both #{r.total}; context switches per 1,000: #{Enum.join(sw, ", ")}"
    )

    {mode, r}
  end

  defp wait(pred) do
    unless pred.() do
      Process.sleep(2)
      wait(pred)
    end
  end

  # The server's postmaster: the parent of its checkpointer (a psql
  # session's own backend may be gone before /proc is read).
  defp postmaster(url) do
    sql = "SELECT pid FROM pg_stat_activity WHERE backend_type = 'checkpointer'"
    {out, 0} = System.cmd("psql", ["-X", "-At", url, "-c", sql])
    {ppid, _} = stat(String.trim(out))
    ppid
  end

  defp pg_ticks(postmaster) do
    kids = for d <- File.ls!("/proc"), d =~ ~r/^\d+$/, match?({^postmaster, _}, stat(d)), do: d
    for p <- [postmaster | kids], {_, t} = stat(p) || {nil, 0}, into: %{}, do: {p, t}
  end

  defp ticks(pid), do: elem(stat(pid), 1)

  # {ppid, utime + stime + cutime + cstime}
  defp stat(pid) do
    case File.read("/proc/#{pid}/stat") do
      {:ok, s} ->
        [_, rest] = String.split(s, ") ", parts: 2)
        f = String.split(rest, " ")
        {Enum.at(f, 1), Enum.sum(for i <- 11..14, do: String.to_integer(Enum.at(f, i)))}

      _ ->
        nil
    end
  end

  defp switches do
    dir = "/proc/#{System.pid()}/task"

    for t <- File.ls!(dir), reduce: %{} do
      acc ->
        name = File.read!("#{dir}/#{t}/comm") |> String.trim() |> String.replace(~r/^\d+_/, "")
        st = File.read!("#{dir}/#{t}/status")

        n =
          for k <- ~w(voluntary nonvoluntary),
              do:
                String.to_integer(
                  hd(Regex.run(~r/#{k}_ctxt_switches:\s+(\d+)/, st, capture: :all_but_first))
                )

        Map.update(acc, name, Enum.sum(n), &(&1 + Enum.sum(n)))
    end
  end
end

Bench.Cpu.run()

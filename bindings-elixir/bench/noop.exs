# No-op steps per second: Elixir workers (through the NIF) against the same
# workload run by pure Rust workers, in one run.
#
#   MIX_ENV=prod mix run bench/noop.exs            # N=20000 CONCURRENCY=50
#   N=50000 CONCURRENCY=100 MIX_ENV=prod mix run bench/noop.exs
#
# Uses DATABASE_URL, or a throwaway PostgreSQL.

defmodule Bench.ElixirNoop do
  use GenDurable

  @impl true
  def handle_step(_step, state, _ctx) do
    {counter, n, pid} = :persistent_term.get(:bench_noop)
    :counters.add(counter, 1, 1)
    if :counters.get(counter, 1) == n, do: send(pid, :bench_done)
    {:done, state}
  end
end

defmodule Bench.Noop do
  def run do
    n = String.to_integer(System.get_env("N", "20000"))
    c = String.to_integer(System.get_env("CONCURRENCY", "50"))
    {:ok, url, pg} = GenDurable.TempPostgres.url_or_start()
    suffix = System.unique_integer([:positive])

    IO.puts("no-op one-step instances: #{n}, queue concurrency: #{c}, Mix env: #{Mix.env()}")

    {:ok, {rust_insert, rust_run}} =
      GenDurable.Native.call(
        &GenDurable.Native.bench_rust_noop(url, "bench_rust_#{suffix}", n, c, &1)
      )

    {ex_insert, ex_run} = elixir(url, "bench_ex_#{suffix}", n, c)

    report("Rust workers", n, rust_insert, rust_run)
    report("Elixir workers", n, ex_insert, ex_run)
    IO.puts("Elixir / Rust steps/s: #{Float.round(rust_run / ex_run, 2)}")
    if pg, do: GenDurable.TempPostgres.stop(pg)
  end

  defp elixir(url, schema, n, c) do
    counter = :counters.new(1, [:atomics])
    :persistent_term.put(:bench_noop, {counter, n, self()})

    # A client-only engine inserts first, as the Rust run does.
    {:ok, client} = GenDurable.start_link(name: :bench_client, url: url, schema: schema)
    t0 = System.monotonic_time()

    for chunk <- Enum.chunk_every(1..n, 5000) do
      {:ok, _} =
        GenDurable.insert_all(Enum.map(chunk, fn _ -> {Bench.ElixirNoop, []} end),
          engine: :bench_client
        )
    end

    inserted = seconds(t0)
    Supervisor.stop(client)

    t1 = System.monotonic_time()

    {:ok, worker} =
      GenDurable.start_link(
        name: :bench_worker,
        url: url,
        schema: schema,
        queues: [default: c],
        workflows: [Bench.ElixirNoop]
      )

    receive do
      :bench_done -> :ok
    end

    Supervisor.stop(worker)
    {inserted, seconds(t1)}
  end

  defp seconds(t0),
    do: System.convert_time_unit(System.monotonic_time() - t0, :native, :microsecond) / 1.0e6

  defp report(who, n, insert, run) do
    IO.puts(
      String.pad_trailing(who, 16) <>
        "insert #{round(n / insert)}/s, run #{round(n / run)} steps/s (#{Float.round(run, 2)} s)"
    )
  end
end

Bench.Noop.run()

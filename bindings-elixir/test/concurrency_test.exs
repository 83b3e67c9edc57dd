defmodule GenDurable.ConcurrencyTest do
  # Timing-based overlap is measured from recorded spans, not asserted
  # against thresholds: only "never more than K" and "more than one at once".
  use ExUnit.Case, async: true
  import GenDurable.TestHelper

  alias GenDurableTest.Timed

  # Maximum number of spans open at once, from {start, end} pairs.
  defp max_overlap(spans) do
    spans
    |> Enum.flat_map(fn {t0, t1} -> [{t0, 1}, {t1, -1}] end)
    # Ends sort before starts at the same instant.
    |> Enum.sort_by(fn {t, d} -> {t, d} end)
    |> Enum.reduce({0, 0}, fn {_, d}, {cur, max} -> {cur + d, max(max, cur + d)} end)
    |> elem(1)
  end

  defp spans(run) do
    :ets.match(:gd_test, {{:span, run, :_}, :"$1", :"$2", :"$3"})
    |> Enum.group_by(fn [key, _, _] -> key end, fn [_, t0, t1] -> {t0, t1} end)
  end

  defp run_all(engine, t, run, keys, per_key) do
    news =
      for key <- keys, _ <- 1..per_key do
        {Timed,
         state: %{"test" => t, "run" => run, "work_ms" => 30},
         concurrency_key: key,
         engine: engine}
      end

    {:ok, ids} = GenDurable.insert_all(news, engine: engine)

    for id <- ids do
      assert_receive {:gd, ^id, "start", _, _}, 60_000
    end

    ids
  end

  test "K = 1: one step at a time per key, observed from Elixir" do
    engine = start_engine(workflows: [Timed], queues: [default: 20])
    t = register()
    run = "k1-#{unique()}"
    run_all(engine, t, run, ["acct:1", "acct:2", {:acct, 3}], 8)

    by_key = spans(run)
    assert Map.keys(by_key) |> Enum.sort() == ["acct:1", "acct:2", "acct:3"]
    for {_key, spans} <- by_key, do: assert(max_overlap(spans) == 1)
    # Different keys did run side by side.
    assert max_overlap(Enum.flat_map(by_key, &elem(&1, 1))) > 1
  end

  test "a gate admits up to its limit per key, and more than one at once" do
    engine =
      start_engine(
        workflows: [Timed],
        queues: [default: 20],
        concurrency_limits: [stripe: [limit: 3, shards: 2]]
      )

    t = register()
    run = "gate-#{unique()}"
    run_all(engine, t, run, ["stripe:1", "stripe:2"], 15)

    for {_key, spans} <- spans(run) do
      overlap = max_overlap(spans)
      assert overlap <= 3
      assert overlap > 1
    end
  end
end

defmodule GenDurable.RoundTripTest do
  # Random JSON values cross the NIF in every direction: a state is
  # inserted, handed to a step, written back as the step's outcome and read
  # with get/2; a signal payload is handed to the step it wakes. Each comes
  # back equal, numbers as JSON numbers: PostgreSQL's jsonb keeps them as
  # decimals, so a float with an integral value may come back as the integer
  # it is written as (4.37094041957421e16 as 43709404195742100), which
  # converts back to the same float.
  #
  # The values are drawn from `:rand` seeded with ExUnit's seed: a failure
  # is reproduced with `mix test --seed <seed>`.
  use ExUnit.Case, async: true
  import GenDurable.TestHelper

  alias GenDurableTest.{RandomJson, RoundTrip}

  @moduletag timeout: 900_000

  setup do
    %{engine: start_engine(workflows: [RoundTrip], queues: [default: 4]), t: register()}
  end

  test "random values round-trip: 100 000 keys, 100 levels, long strings, big arrays", %{
    engine: e,
    t: t
  } do
    seed = ExUnit.configuration()[:seed]
    RandomJson.seed(seed)

    sized = [
      {"100 000 keys", fn -> Map.new(1..100_000, &{"k#{&1}", RandomJson.scalar()}) end},
      {"10 000 keys holding containers",
       fn -> Map.new(1..10_000, &{"k#{&1}", RandomJson.value(6, 4)}) end},
      {"nested to the depth limit",
       fn -> %{"deep" => RandomJson.nested(RandomJson.max_depth() - 1)} end},
      {"long strings",
       fn ->
         %{
           "unicode" => RandomJson.string(1_000_000),
           "escapes" => String.duplicate("\"\\\n\u0001", 100_000),
           "ascii" => String.duplicate("x", 20_000_000)
         }
       end},
      {"a big array", fn -> %{"a" => for(_ <- 1..100_000, do: RandomJson.scalar())} end}
    ]

    random = for i <- 1..40, do: {"random #{i}", fn -> RandomJson.map(:rand.uniform(3_000)) end}

    for {name, gen} <- sized ++ random do
      state = Map.put(gen.(), "test", t)
      payload = RandomJson.value(:rand.uniform(3_000))
      round_trip(e, "#{name} (seed #{seed})", state, payload)
    end

    # The VM, the engine and its processes are still there.
    assert Process.alive?(Process.whereis(Module.concat(e, Engine)))
    assert Process.alive?(Process.whereis(Module.concat(e, Dispatcher)))
  end

  defp round_trip(e, name, state, payload) do
    {:ok, id} = GenDurable.insert(RoundTrip, state: state, engine: e)

    assert_receive {:rt, ^id, "start", got, nil}, 120_000
    same!(got, state, "#{name}: the state the first step got")

    wait_status(e, id, :awaiting)
    assert {:ok, 1} = GenDurable.signal("rt:#{id}", payload, engine: e)

    assert_receive {:rt, ^id, "woken", got, {:signal, _, got_payload}}, 120_000
    same!(got_payload, payload, "#{name}: the signal's payload")
    same!(got, state, "#{name}: the state the second step got")

    i = wait_status(e, id, :completed)
    same!(i.state, state, "#{name}: the state read back")
  end

  # Like `assert a == b`, saying where they differ instead of printing both.
  defp same!(a, b, what) do
    case difference(a, b, []) do
      nil -> :ok
      {path, x, y} -> flunk("#{what} differs at #{inspect(path)}: #{short(x)} != #{short(y)}")
    end
  end

  defp difference(a, b, path) when is_map(a) and is_map(b) do
    cond do
      map_size(a) != map_size(b) or Map.keys(a) != Map.keys(b) ->
        {Enum.reverse(path), Map.keys(a) -- Map.keys(b), Map.keys(b) -- Map.keys(a)}

      true ->
        Enum.find_value(a, fn {k, v} -> difference(v, Map.fetch!(b, k), [k | path]) end)
    end
  end

  defp difference(a, b, path) when is_list(a) and is_list(b) do
    if length(a) != length(b) do
      {Enum.reverse(path), {:length, length(a)}, {:length, length(b)}}
    else
      Enum.zip(a, b)
      |> Enum.with_index()
      |> Enum.find_value(fn {{x, y}, i} -> difference(x, y, [i | path]) end)
    end
  end

  defp difference(a, b, path), do: if(equal?(a, b), do: nil, else: {Enum.reverse(path), a, b})

  defp equal?(a, b) when is_float(a) and is_integer(b), do: a == b * 1.0
  defp equal?(a, b) when is_integer(a) and is_float(b), do: a * 1.0 == b
  defp equal?(a, b), do: a === b

  defp short(x), do: inspect(x, limit: 10, printable_limit: 100)
end

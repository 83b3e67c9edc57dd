defmodule GenDurable.UniqueTest do
  use ExUnit.Case, async: true
  import GenDurable.TestHelper

  alias GenDurable.Error
  alias GenDurableTest.{RandomJson, Steps}

  # Instances of a workflow no node runs stay available: their identities
  # are held for the whole test.
  @idle "GenDurableTest.Idle"

  setup do
    opts = engine_opts(workflows: [Steps])
    start_supervised!({GenDurable, opts})
    %{engine: opts[:name], schema: opts[:schema]}
  end

  defp rows(schema, where),
    do: sql(~s|SELECT count(*) FROM "#{schema}".instances WHERE #{where}|)

  test "a plain insert returns an id; a unique one its id and conflict flag", %{engine: e} do
    assert {:ok, id} = GenDurable.insert(@idle, state: %{a: 1}, engine: e)
    assert is_integer(id)

    opts = [state: %{account: 7, asked_by: "ops"}, unique: [fields: [:account]], engine: e]
    assert {:ok, %{id: first, conflict?: false}} = GenDurable.insert(@idle, opts)

    # Only the fields named make the identity; the rest may differ.
    dup = Keyword.put(opts, :state, %{"account" => 7, "asked_by" => "cron"})
    assert {:ok, %{id: ^first, conflict?: true}} = GenDurable.insert(@idle, dup)
    assert %{id: ^first, conflict?: true} = GenDurable.insert!(@idle, dup)

    other = Keyword.put(opts, :state, %{"account" => 8})
    assert {:ok, %{id: second, conflict?: false}} = GenDurable.insert(@idle, other)
    assert second != first

    # Fields as strings, and the whole state by default (`true` or `[]`).
    assert {:ok, %{id: ^first, conflict?: true}} =
             GenDurable.insert(@idle, Keyword.put(dup, :unique, fields: ["account"]))

    assert {:ok, %{id: whole, conflict?: false}} =
             GenDurable.insert(@idle, state: %{b: 1}, unique: true, engine: e)

    assert {:ok, %{id: ^whole, conflict?: true}} =
             GenDurable.insert(@idle, state: %{b: 1}, unique: [], engine: e)

    # `false` and `nil` are plain inserts.
    assert {:ok, plain} = GenDurable.insert(@idle, state: %{b: 1}, unique: false, engine: e)
    assert is_integer(plain) and plain != whole
    assert {:ok, plain2} = GenDurable.insert(@idle, state: %{b: 1}, unique: nil, engine: e)
    assert is_integer(plain2)

    # The workflow and the concurrency key are part of the identity.
    assert {:ok, %{conflict?: false}} =
             GenDurable.insert(@idle,
               state: %{b: 1},
               unique: true,
               concurrency_key: "k:1",
               engine: e
             )

    assert {:ok, %{conflict?: false}} =
             GenDurable.insert("Another", state: %{b: 1}, unique: true, engine: e)
  end

  test "insert_all: a duplicate within the batch reports the first", %{engine: e} do
    batch = [
      {@idle, state: %{n: 1}, idempotency_key: "batch:1"},
      {@idle, state: %{n: 2}},
      {@idle, state: %{n: 3}, idempotency_key: "batch:1"},
      {@idle, state: %{account: 5, n: 4}, unique: [fields: [:account]]},
      {@idle, state: %{account: 5, n: 5}, unique: [fields: [:account]]}
    ]

    assert {:ok, [a, plain, b, c, d]} = GenDurable.insert_all(batch, engine: e)
    assert %{id: first, conflict?: false} = a
    assert is_integer(plain)
    assert b == %{id: first, conflict?: true}
    assert %{id: held, conflict?: false} = c
    assert d == %{id: held, conflict?: true}

    # Again: every unique one is now a conflict, the plain one a new row.
    assert [^b, again, ^b, ^d, ^d] = GenDurable.insert_all!(batch, engine: e)
    assert is_integer(again) and again != plain
  end

  test "an idempotency key with states: :active lets a new instance in once it completed",
       %{engine: e} do
    t = register()

    opts = [
      state: %{"mode" => "next_done", "test" => t},
      idempotency_key: "charge:#{unique()}",
      unique: [states: :active],
      engine: e
    ]

    assert {:ok, %{id: first, conflict?: false}} = GenDurable.insert(Steps, opts)
    assert_receive {:gd, ^first, "start", _, _}, 10_000
    wait_status(e, first, :completed)

    assert {:ok, %{id: second, conflict?: false}} = GenDurable.insert(Steps, opts)
    assert second != first

    # With the default statuses, the completed one would have held the key.
    key = "charge:#{unique()}"
    held = Keyword.merge(opts, idempotency_key: key, unique: nil)
    assert {:ok, %{id: id, conflict?: false}} = GenDurable.insert(Steps, held)
    wait_status(e, id, :completed)
    assert {:ok, %{id: ^id, conflict?: true}} = GenDurable.insert(Steps, held)
  end

  test "racing insert_all calls: one row per identity, every caller told its id",
       %{engine: e, schema: schema} do
    run = unique()
    identities = for i <- 1..30, do: i
    parent = self()

    tasks =
      for n <- 1..8 do
        Task.async(fn ->
          # Half by idempotency key, half by state fields; each caller in
          # its own order.
          news =
            identities
            |> Enum.shuffle()
            |> Enum.map(fn i ->
              if rem(i, 2) == 0,
                do:
                  {@idle,
                   state: %{run: run, i: i, caller: n}, idempotency_key: "race:#{run}:#{i}"},
                else: {@idle, state: %{run: run, i: i, caller: n}, unique: [fields: [:run, :i]]}
            end)

          send(parent, {:ready, self()})

          receive do
            :go -> :ok
          end

          {:ok, results} = GenDurable.insert_all(news, engine: e)
          Enum.zip(Enum.map(news, fn {_, o} -> o[:state].i end), results)
        end)
      end

    for %Task{pid: pid} <- tasks, do: assert_receive({:ready, ^pid}, 10_000)
    for %Task{pid: pid} <- tasks, do: send(pid, :go)
    results = tasks |> Task.await_many(60_000) |> List.flatten()

    by_identity = Enum.group_by(results, &elem(&1, 0), &elem(&1, 1))
    assert map_size(by_identity) == 30

    for {i, told} <- by_identity do
      assert length(told) == 8
      assert told |> Enum.map(& &1.id) |> Enum.uniq() |> length() == 1, "identity #{i}"
      assert Enum.count(told, &(not &1.conflict?)) == 1, "identity #{i}"
    end

    assert rows(schema, "state ->> 'run' = '#{run}'") == ["30"]

    ids = for {_, [%{id: id} | _]} <- by_identity, do: id

    assert rows(schema, "id IN (#{Enum.join(ids, ", ")})") == ["30"]
  end

  test "bad unique options are the core's errors", %{engine: e} do
    cases = [
      {[unique: [period: 500]], :"unique.period",
       "invalid unique.period: must be at least 1 second, got 500ms"},
      {[unique: [period: -1]], :"unique.period",
       "invalid unique.period: expected a positive integer (milliseconds), got -1"},
      {[unique: [states: :done]], :"unique.states",
       ~s(invalid unique.states: expected "active", "all" or a list of statuses, got "done")},
      {[unique: [states: [:finished]]], :"unique.states",
       ~s|invalid unique.states: "finished" is not a status (scheduled, available, executing, | <>
         "awaiting, completed, cancelled, discarded)"},
      {[unique: [states: [:scheduled, :available, :awaiting]]], :"unique.states",
       "invalid unique.states: must include scheduled, available, executing and awaiting " <>
         "(missing executing)"},
      {[unique: [fields: :account]], :"unique.fields",
       ~s(invalid unique.fields: expected a list, got "account")},
      {[unique: [fields: []]], :"unique.fields",
       "invalid unique.fields: must name 1 to 64 state fields, got 0"},
      {[unique: [keys: [:account]]], :unique,
       ~s|invalid unique: unknown option "keys" (known: fields, period, states)|},
      {[unique: "yes"], :unique,
       "invalid unique: expected a map with fields, period (milliseconds) and states, " <>
         ~s(each optional, got "yes")},
      {[unique: [fields: [:a], fields: [:b]]], :unique, "invalid unique: :fields is given twice"},
      {[idempotency_key: ""], :idempotency_key, "invalid idempotency_key: must not be empty"},
      {[idempotency_key: 42], :idempotency_key,
       "invalid idempotency_key: expected a string, got 42"},
      {[idempotency_key: "a\0b"], :idempotency_key,
       "invalid idempotency_key: must not contain NUL bytes"}
    ]

    for {opts, field, message} <- cases do
      assert {:error, %Error{kind: :invalid_input, field: ^field, message: m}} =
               GenDurable.insert(@idle, opts ++ [engine: e])

      assert String.starts_with?(m, message), "#{inspect(opts)}: #{m}"
    end

    e1 =
      assert_raise Error, fn ->
        GenDurable.insert_all!([{@idle, []}, {@idle, unique: [period: 0]}], engine: e)
      end

    assert e1.field == :"unique.period"
    assert e1.message =~ "(instance 1 of 2; nothing was inserted)"
  end

  test "random unique options are inserted or refused, never a crash", %{engine: e} do
    seed = ExUnit.configuration()[:seed]
    RandomJson.seed(seed)

    # Any value at all, or one of a kind the option takes, often valid.
    any = fn ->
      Enum.random([
        RandomJson.value(20),
        RandomJson.scalar(),
        Enum.random([:active, :all, :done, nil, true, -1, 0, 999, 2 ** 64, 1.5, [], %{}]),
        {:tuple},
        self()
      ])
    end

    statuses = [:scheduled, :available, :executing, :awaiting, :completed, :cancelled, :discarded]

    plausible = %{
      fields: fn ->
        Enum.map(1..:rand.uniform(3), fn _ -> Enum.random([:a, "b", RandomJson.string()]) end)
      end,
      period: fn -> Enum.random([1_000, 60_000, 3_600_000, :rand.uniform(2 ** 40)]) end,
      states: fn ->
        Enum.random([:active, :all, Enum.take_random(statuses, 4 + :rand.uniform(3)), statuses])
      end,
      idempotency_key: fn -> Enum.random(["k:#{:rand.uniform(20)}", RandomJson.string()]) end
    }

    value = fn name -> if :rand.uniform(3) == 1, do: any.(), else: plausible[name].() end

    for _ <- 1..300 do
      unique =
        case :rand.uniform(6) do
          1 ->
            any.()

          _ ->
            for name <- Enum.take_random([:fields, :period, :states], 2), do: {name, value.(name)}
        end

      opts =
        [state: RandomJson.map(10), unique: unique, engine: e] ++
          if :rand.uniform(3) == 1, do: [idempotency_key: value.(:idempotency_key)], else: []

      case GenDurable.insert(@idle, opts) do
        {:ok, id} when is_integer(id) ->
          assert unique in [nil, false] and opts[:idempotency_key] == nil

        {:ok, %{id: id, conflict?: c}} ->
          assert is_integer(id) and is_boolean(c)

        {:error, %Error{kind: :invalid_input, message: m}} ->
          assert is_binary(m)
      end
    end
  end
end

defmodule GenDurable.EnqueueQueryTest do
  use ExUnit.Case, async: true
  import GenDurable.TestHelper

  alias GenDurable.Error
  alias GenDurableTest.{Charge, Limited, Steps}

  describe "the statement" do
    test "names only the options given, every value a parameter" do
      assert GenDurable.enqueue_query("Remote.Flow") ==
               {~s|SELECT id, conflict FROM "gendurable".enqueue(workflow => $1, state => $2::text::jsonb)|,
                ["Remote.Flow", "{}"]}

      at = ~U[2030-01-01 12:00:00.250000Z]

      {sql, params} =
        GenDurable.enqueue_query(Steps, %{n: 1},
          schema: "app_jobs",
          step: "b",
          queue: "mailers",
          priority: 3,
          concurrency_key: {:account, 7},
          rate_limit: "api:x",
          max_attempts: 4,
          scheduled_at: at
        )

      assert sql ==
               ~s|SELECT id, conflict FROM "app_jobs".enqueue(| <>
                 ~s|workflow => $1, state => $2::text::jsonb, | <>
                 ~s|step => $3, queue => $4, priority => $5::integer, concurrency_key => $6, | <>
                 ~s|rate_limit => $7, max_attempts => $8::integer, | <>
                 ~s|scheduled_at => $9::text::timestamptz)|

      assert params == [
               "GenDurableTest.Steps",
               ~s|{"n":1}|,
               "b",
               "mailers",
               3,
               "account:7",
               "api:x",
               4,
               "2030-01-01T12:00:00.250Z"
             ]

      assert {_, [_, _, 1500]} = GenDurable.enqueue_query("W", %{}, schedule_in: 1500)
    end

    test "unique options and idempotency keys become parameters" do
      {sql, params} =
        GenDurable.enqueue_query("W", %{a: 1},
          concurrency_key: "k:1",
          unique: [fields: [:a, "b"], period: 60_000, states: :active],
          idempotency_key: "charge:42"
        )

      assert sql ==
               ~s|SELECT id, conflict FROM "gendurable".enqueue(| <>
                 ~s|workflow => $1, state => $2::text::jsonb, concurrency_key => $3, | <>
                 ~s|"unique" => $4::boolean, unique_fields => $5::text[], | <>
                 ~s|unique_period => $6::bigint * interval '1 millisecond', | <>
                 ~s|unique_states => $7::text[], idempotency_key => $8)|

      assert params == [
               "W",
               ~s|{"a":1}|,
               "k:1",
               true,
               ["a", "b"],
               60_000,
               ["scheduled", "available", "executing", "awaiting"],
               "charge:42"
             ]

      all = ~w(scheduled available executing awaiting completed cancelled discarded)

      assert {_, ["W", "{}", true, ^all]} =
               GenDurable.enqueue_query("W", %{}, unique: [states: :all])

      assert {_, ["W", "{}", true, ["scheduled", "completed"]]} =
               GenDurable.enqueue_query("W", %{}, unique: [states: [:scheduled, "completed"]])

      for defaults <- [true, []] do
        assert {sql, ["W", "{}", true]} = GenDurable.enqueue_query("W", %{}, unique: defaults)
        assert sql =~ ~s|"unique" => $3::boolean)|
      end

      assert {_, ["W", "{}"]} = GenDurable.enqueue_query("W", %{}, unique: false)
      assert {_, ["W", "{}", "k"]} = GenDurable.enqueue_query("W", %{}, idempotency_key: "k")

      e = assert_raise Error, fn -> GenDurable.enqueue_query("W", %{}, unique: [keys: [:a]]) end
      assert %Error{field: :unique, message: "invalid unique: unknown option \"keys\"" <> _} = e

      e = assert_raise Error, fn -> GenDurable.enqueue_query("W", %{}, idempotency_key: "a\0") end
      assert e.message == "invalid idempotency_key: must not contain NUL bytes"

      e =
        assert_raise Error, fn ->
          GenDurable.enqueue_query("W", %{}, unique: [fields: ["a\0"]])
        end

      assert e.field == :"unique.fields"
    end

    test "a module's declared defaults and first step's rate limit apply unless given" do
      assert {_, ["GenDurableTest.Charge", "{}", "billing", 2, 5]} =
               GenDurable.enqueue_query(Charge)

      assert {_, ["GenDurableTest.Charge", "{}", "billing", 7, 5]} =
               GenDurable.enqueue_query(Charge, %{}, priority: 7)

      assert {sql, [_, _, "call_api", "openai:default"]} =
               GenDurable.enqueue_query(Limited, %{}, step: "call_api")

      assert sql =~ "rate_limit => $4"

      assert {_, [_, _, "call_api", "api:x"]} =
               GenDurable.enqueue_query(Limited, %{}, step: "call_api", rate_limit: "api:x")

      # By its name, nothing is known of the workflow.
      assert {_, ["GenDurableTest.Charge", "{}"]} =
               GenDurable.enqueue_query("GenDurableTest.Charge")
    end

    test "what cannot become a parameter raises as an insert returns it" do
      e = assert_raise Error, fn -> GenDurable.enqueue_query("W", %{"pid" => self()}) end
      assert %Error{kind: :invalid_input, field: :state} = e
      assert e.message == "invalid state: not JSON: a pid is not JSON"

      e = assert_raise Error, fn -> GenDurable.enqueue_query("W", %{"a" => "x\0y"}) end
      assert e.message == "invalid state: must not contain NUL (\\u0000) characters"

      e = assert_raise Error, fn -> GenDurable.enqueue_query("W", %{}, priority: "high") end
      assert %Error{field: :priority, message: "invalid priority: expected an integer" <> _} = e

      e = assert_raise Error, fn -> GenDurable.enqueue_query(String, %{}) end
      assert e.field == :workflow

      for schema <- ["Public", "a-b", ~s|x"; DROP TABLE t; --|, "1a", :gendurable] do
        e = assert_raise Error, fn -> GenDurable.enqueue_query("W", %{}, schema: schema) end
        assert %Error{kind: :invalid_input, field: :schema} = e
      end

      for opts <- [[engine: GenDurable], [state: %{}], [priority: 1, priority: 2], :nope] do
        e = assert_raise Error, fn -> GenDurable.enqueue_query("W", %{}, opts) end
        assert e.field == :options
      end
    end
  end

  describe "run in the application's transaction" do
    setup do
      opts = engine_opts(workflows: [Steps, Charge])
      start_supervised!({GenDurable, opts})
      %{engine: opts[:name], schema: opts[:schema]}
    end

    defp count(schema, id),
      do: sql(~s|SELECT count(*) FROM "#{schema}".instances WHERE id = #{id}|)

    # The id of a row `id|f`: an instance inserted, not a conflict.
    defp enqueued(row) do
      [id, "f"] = String.split(row, "|")
      String.to_integer(id)
    end

    test "a rollback leaves nothing", %{schema: schema} do
      {sql, params} = GenDurable.enqueue_query(Steps, %{"mode" => "next_done"}, schema: schema)
      assert {:ok, [row]} = sql_params(sql, params, "ROLLBACK")
      assert [id, "f"] = String.split(row, "|")
      assert count(schema, id) == ["0"]
    end

    test "a commit is run to completion by the engine", %{engine: e, schema: schema} do
      t = register()
      state = %{"mode" => "next_done", "test" => t}
      {sql, params} = GenDurable.enqueue_query(Steps, state, schema: schema)
      assert {:ok, [row]} = sql_params(sql, params)
      id = enqueued(row)

      assert_receive {:gd, ^id, "start", _, _}, 10_000
      i = wait_status(e, id, :completed)
      assert i.state == Map.put(state, "n", 2)
    end

    test "the module's defaults are stored", %{engine: e, schema: schema} do
      {sql, params} = GenDurable.enqueue_query(Charge, %{}, schema: schema, schedule_in: 60_000)
      assert {:ok, [row]} = sql_params(sql, params)
      {:ok, i} = GenDurable.get(enqueued(row), engine: e)
      assert {i.queue, i.priority, i.max_attempts, i.status} == {"billing", 2, 5, :scheduled}
    end

    test "a bad value is refused by the function with the client's message", %{schema: schema} do
      {sql, params} = GenDurable.enqueue_query(Steps, %{}, schema: schema, priority: 12)
      assert {:error, out} = sql_params(sql, params)
      assert out =~ "22023"
      assert out =~ "invalid priority: must be 0 to 9, got 12"
    end

    test "a unique enqueue meets the instance holding its identity", %{engine: e, schema: schema} do
      state = %{"mode" => "cancel", "account" => unique()}

      assert {:ok, %{id: holder, conflict?: false}} =
               GenDurable.insert("Nobody.Runs",
                 state: state,
                 unique: [fields: [:account]],
                 engine: e
               )

      {sql, params} =
        GenDurable.enqueue_query("Nobody.Runs", Map.put(state, "other", 1),
          schema: schema,
          unique: [fields: [:account]]
        )

      assert {:ok, [row]} = sql_params(sql, params)
      assert row == "#{holder}|t"

      # By idempotency key: a cancelled holder lets a new instance in (the
      # default statuses), which then holds the key for inserts too.
      key = "charge:#{unique()}"
      {sql, params} = GenDurable.enqueue_query(Steps, state, schema: schema, idempotency_key: key)
      assert {:ok, [row]} = sql_params(sql, params)
      first = enqueued(row)
      wait_status(e, first, :cancelled)

      {sql, params} =
        GenDurable.enqueue_query("Nobody.Runs", %{}, schema: schema, idempotency_key: key)

      assert {:ok, [row]} = sql_params(sql, params)
      second = enqueued(row)
      assert second != first

      assert {:ok, %{id: ^second, conflict?: true}} =
               GenDurable.insert(Steps, idempotency_key: key, engine: e)

      # A bad list of statuses is the function's to refuse.
      {sql, params} =
        GenDurable.enqueue_query(Steps, %{}, schema: schema, unique: [states: [:scheduled]])

      assert {:error, out} = sql_params(sql, params)
      assert out =~ "22023"

      assert out =~
               "invalid unique.states: must include scheduled, available, executing and awaiting"
    end

    test "values travel as parameters, exactly", %{engine: e, schema: schema} do
      nasty = ~s|it's "quoted" \\ '; DROP TABLE #{schema}.instances; --|
      state = %{"mode" => "cancel", "text" => nasty, "nested" => [nasty, %{nasty => 1}]}
      key = "tenant:" <> nasty

      {sql, params} = GenDurable.enqueue_query(Steps, state, schema: schema, concurrency_key: key)

      refute sql =~ "DROP"
      refute sql =~ "'"
      assert Regex.scan(~r/\$\d+/, sql) |> length() == length(params)

      assert {:ok, [row]} = sql_params(sql, params)
      i = wait_status(e, enqueued(row), :cancelled)
      assert i.state == state
      assert i.concurrency_key == key
    end
  end
end

defmodule GenDurable.EnqueueQueryTest do
  use ExUnit.Case, async: true
  import GenDurable.TestHelper

  alias GenDurable.Error
  alias GenDurableTest.{Charge, Limited, Steps}

  describe "the statement" do
    test "names only the options given, every value a parameter" do
      assert GenDurable.enqueue_query("Remote.Flow") ==
               {~s|SELECT "gendurable".enqueue(workflow => $1, state => $2::text::jsonb)|,
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
               ~s|SELECT "app_jobs".enqueue(workflow => $1, state => $2::text::jsonb, | <>
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

    test "a rollback leaves nothing", %{schema: schema} do
      {sql, params} = GenDurable.enqueue_query(Steps, %{"mode" => "next_done"}, schema: schema)
      assert {:ok, [id]} = sql_params(sql, params, "ROLLBACK")
      assert count(schema, id) == ["0"]
    end

    test "a commit is run to completion by the engine", %{engine: e, schema: schema} do
      t = register()
      state = %{"mode" => "next_done", "test" => t}
      {sql, params} = GenDurable.enqueue_query(Steps, state, schema: schema)
      assert {:ok, [id]} = sql_params(sql, params)
      id = String.to_integer(id)

      assert_receive {:gd, ^id, "start", _, _}, 10_000
      i = wait_status(e, id, :completed)
      assert i.state == Map.put(state, "n", 2)
    end

    test "the module's defaults are stored", %{engine: e, schema: schema} do
      {sql, params} = GenDurable.enqueue_query(Charge, %{}, schema: schema, schedule_in: 60_000)
      assert {:ok, [id]} = sql_params(sql, params)
      {:ok, i} = GenDurable.get(String.to_integer(id), engine: e)
      assert {i.queue, i.priority, i.max_attempts, i.status} == {"billing", 2, 5, :scheduled}
    end

    test "a bad value is refused by the function with the client's message", %{schema: schema} do
      {sql, params} = GenDurable.enqueue_query(Steps, %{}, schema: schema, priority: 12)
      assert {:error, out} = sql_params(sql, params)
      assert out =~ "22023"
      assert out =~ "invalid priority: must be 0 to 9, got 12"
    end

    test "values travel as parameters, exactly", %{engine: e, schema: schema} do
      nasty = ~s|it's "quoted" \\ '; DROP TABLE #{schema}.instances; --|
      state = %{"mode" => "cancel", "text" => nasty, "nested" => [nasty, %{nasty => 1}]}
      key = "tenant:" <> nasty

      {sql, params} = GenDurable.enqueue_query(Steps, state, schema: schema, concurrency_key: key)

      refute sql =~ "DROP"
      refute sql =~ "'"
      assert Regex.scan(~r/\$\d+/, sql) |> length() == length(params)

      assert {:ok, [id]} = sql_params(sql, params)
      i = wait_status(e, String.to_integer(id), :cancelled)
      assert i.state == state
      assert i.concurrency_key == key
    end
  end
end

defmodule GenDurable.ErrorsTest do
  use ExUnit.Case, async: true
  import GenDurable.TestHelper

  alias GenDurable.Error
  alias GenDurableTest.Steps

  setup do
    %{engine: start_engine(workflows: [Steps])}
  end

  defp insert(e, opts), do: GenDurable.insert(Steps, [engine: e] ++ opts)

  test "bad insert input is refused with a clear message", %{engine: e} do
    cases = [
      {[state: [1, 2]], :state, "must be a JSON object"},
      {[state: %{"pid" => self()}], :state, "not JSON"},
      {[state: %{"t" => DateTime.utc_now()}], :state, "struct"},
      {[state: %{"bin" => <<255, 0>>}], :state, "UTF-8"},
      {[priority: 12], :priority, "must be 0 to 9, got 12"},
      {[priority: "high"], :priority, ~s(expected an integer, got "high")},
      {[queue: ""], :queue, "queue"},
      {[queue: 5], :queue, "expected a string, got 5"},
      {[step: "a\0b"], :step, "step"},
      {[concurrency_key: ""], :concurrency_key, "concurrency_key"},
      {[concurrency_key: {:stripe, %{}}], :concurrency_key, "not JSON"},
      {[concurrency_key: String.duplicate("k", 100_000)], :concurrency_key, "concurrency_key"},
      {[rate_limit: "nope:1"], :rate_limit, "rate"},
      {[max_attempts: 0], :max_attempts, "must be at least 1, got 0"},
      {[schedule_in: -5], :schedule_in, "expected a non-negative integer (milliseconds), got -5"},
      {[scheduled_at: "tomorrow"], :scheduled_at, "expected an RFC 3339 timestamp"},
      {[schedule_in: 5, scheduled_at: DateTime.utc_now()], :scheduled_at, "not both"},
      {[colour: :blue], :options, ~s(unknown option "colour")},
      {[queue: "a", queue: "b"], :options, ":queue is given twice"},
      {[queue: <<255, 1>>], :queue, "not valid UTF-8"},
      {[state: %{"huge" => String.duplicate("x", 65 * 1024 * 1024)}], :state, "limit"},
      {[state: %{"l" => Enum.reduce(1..300, [], fn _, acc -> [acc] end)}], :state,
       "nested deeper"},
      {[state: %{"f" => fn -> :ok end}], :state, "not JSON"},
      {[state: %{1 => "int keys are fine", {:t} => "tuple keys are not"}], :state, "map keys"}
    ]

    for {opts, field, text} <- cases do
      case insert(e, opts) do
        {:error, %Error{kind: :invalid_input, field: ^field, message: m}} ->
          assert m =~ text, "#{inspect(opts, limit: 5)}: #{m}"

        other ->
          flunk("#{inspect(opts, limit: 5, printable_limit: 50)}: #{inspect(other)}")
      end
    end
  end

  test "a large state round-trips through the database", %{engine: e} do
    big = String.duplicate("é", 500_000)
    {:ok, id} = insert(e, state: %{"big" => big, "list" => Enum.to_list(1..10_000), "f" => 1.5})
    {:ok, i} = GenDurable.get(id, engine: e)
    assert i.state["big"] == big
    assert i.state["list"] == Enum.to_list(1..10_000)
    assert i.state["f"] == 1.5
  end

  test "states nested up to 100 levels are accepted, deeper ones refused", %{engine: e} do
    nest = fn n -> Enum.reduce(1..n, %{}, fn _, acc -> %{"a" => acc} end) end
    assert {:ok, id} = insert(e, state: nest.(99))
    assert {:ok, %{state: state}} = GenDurable.get(id, engine: e)
    assert state == nest.(99)
    assert {:error, %Error{field: :state, message: m}} = insert(e, state: nest.(100))
    assert m =~ "nested deeper than 100"

    assert {:error, %Error{field: :payload}} = GenDurable.signal("s", [nest.(100_000)], engine: e)
  end

  test "insert options are translated for the core", %{engine: e} do
    at = DateTime.add(DateTime.utc_now(), 3600, :second)

    {:ok, id} =
      insert(e,
        queue: :other,
        concurrency_key: {:account, 7},
        rate_limit: nil,
        scheduled_at: DateTime.to_iso8601(at),
        priority: 3
      )

    assert {:ok, i} = GenDurable.get(id, engine: e)
    assert {i.queue, i.concurrency_key, i.priority} == {"other", "account:7", 3}
    assert abs(DateTime.diff(i.scheduled_at, at, :millisecond)) < 1000
    assert {:ok, :now} = GenDurable.cancel(id, engine: e)
  end

  test "bad workflow names", %{engine: e} do
    assert {:error, %Error{kind: :invalid_input, field: :workflow}} =
             GenDurable.insert(123, engine: e)

    assert {:error, %Error{kind: :invalid_input, field: :workflow}} =
             GenDurable.insert("", engine: e)

    # An unknown workflow is kept for a node that knows it.
    assert {:ok, id} = GenDurable.insert("Some.Other.Workflow", engine: e)
    assert {:ok, %{status: :available}} = GenDurable.get(id, engine: e)
  end

  test "a module that is not a workflow is refused", %{engine: e} do
    assert {:error, %Error{kind: :invalid_input, field: :workflow, message: m}} =
             GenDurable.insert(Enum, engine: e)

    assert m =~ "Enum is not a workflow (it does not `use GenDurable`)"

    assert {:error, %Error{field: :workflow, message: m}} =
             GenDurable.insert(No.Such.Module, engine: e)

    assert m =~ "no module No.Such.Module is available"
    assert m =~ "by its name, as a string"

    assert {:error, %Error{field: :workflow, message: m}} =
             GenDurable.insert_all([{Steps, []}, {String, []}], engine: e)

    assert m =~ "String is not a workflow"
    assert m =~ "instance 1 of 2; nothing was inserted"
  end

  test "insert_all: nothing is inserted when one instance is bad", %{engine: e} do
    assert {:error, %Error{field: :priority, message: m}} =
             GenDurable.insert_all([{Steps, []}, {Steps, priority: 99}], engine: e)

    assert m =~ "instance 1 of 2"
    assert {:ok, []} = GenDurable.insert_all([], engine: e)
  end

  test "not found, not running, bad ids and signals", %{engine: e} do
    assert {:error, %Error{kind: :not_found, message: m}} = GenDurable.get(-1, engine: e)
    assert m =~ "-1"
    assert {:error, %Error{kind: :not_found}} = GenDurable.cancel(-1, engine: e)
    assert {:error, %Error{kind: :invalid_input, field: :id}} = GenDurable.get("1", engine: e)

    assert {:error, %Error{kind: :not_running, message: m}} =
             GenDurable.insert(Steps, engine: :nobody)

    assert m =~ ":nobody"

    assert {:error, %Error{kind: :invalid_input, field: :signal}} =
             GenDurable.signal("", %{}, engine: e)

    assert {:error, %Error{kind: :invalid_input, field: :payload}} =
             GenDurable.signal("s", {:tuple}, engine: e)
  end

  test "bang variants raise GenDurable.Error", %{engine: e} do
    assert_raise Error, ~r/priority/, fn -> GenDurable.insert!(Steps, priority: -1, engine: e) end
    assert_raise Error, ~r/no instance/, fn -> GenDurable.get!(-1, engine: e) end
    assert_raise Error, fn -> GenDurable.cancel!(-1, engine: e) end
    assert_raise Error, fn -> GenDurable.signal!("", %{}, engine: e) end
    assert_raise Error, fn -> GenDurable.insert_all!([{Steps, state: 1}], engine: e) end
    assert is_integer(GenDurable.insert!(Steps, engine: e, state: %{"mode" => "cancel"}))
  end

  describe "engine options" do
    test "refused before anything starts" do
      # A configuration the core refuses stops the supervisor being started.
      Process.flag(:trap_exit, true)

      cases = [
        {[colour: :blue], ~s(engine options: unknown option "colour")},
        {[queues: [default: 0]], ~s(queue "default": concurrency must be from 1 to 10000, got 0)},
        {[queues: [default: "x"]],
         ~s(engine option queues.default: expected a positive integer, got "x")},
        {[queues: :default], ~s(engine option queues: expected a map, got "default")},
        {[queues: [default: 1, default: 2]], ~s(engine option queues: "default" is given twice)},
        {[queues: [default: 1], queues: [other: 2]], ~s(engine options: "queues" is given twice)},
        {[concurrency_limits: [stripe: [limit: 0]]], "limit must be at least 1"},
        {[concurrency_limits: [stripe: [shards: 2]]],
         "engine option concurrency_limits.stripe: limit is required"},
        {[concurrency_limits: [stripe: [limit: 2, size: 1]]],
         ~s(engine option concurrency_limits.stripe: unknown option "size")},
        {[concurrency_limits: [s: [limit: 2], s: [limit: 3]]],
         ~s(engine option concurrency_limits: "s" is given twice)},
        {[concurrency_limits: [stripe: [limit: {:ten}]]],
         "engine option concurrency_limits.stripe.limit: not JSON: a tuple is not JSON"},
        {[rate_limits: [openai: [limit: 10, period: 0]]], "period"},
        {[rate_limits: [openai: [limit: 10]]],
         "engine option rate_limits.openai: period is required"},
        {[workflows: [String]], "does not define handle_step/3"},
        {[workflows: [Steps, Steps]], "GenDurableTest.Steps is configured twice"},
        {[workflows: [NoSuchModule]], "not available"},
        {[poll_interval: -1],
         "engine option poll_interval: expected a positive integer (milliseconds), got -1"},
        {[schema: "bad schema;"], "schema"},
        {[lease: 1000, heartbeat_interval: 1000], "lease"},
        {[retention: :forever], ~s(engine option retention: expected)},
        {[name: "x"], ":name must be an atom"},
        {[url: ""], "database url"}
      ]

      for {opts, text} <- cases do
        opts = Keyword.put_new(opts, :name, :"bad_#{unique()}")

        assert {:error, %Error{kind: :invalid_config, message: m}} =
                 GenDurable.start_link(Keyword.put_new(opts, :url, url())),
               inspect(opts)

        assert m =~ text, "#{inspect(opts)}: #{m}"
      end

      assert {:error, %Error{message: m}} = GenDurable.start_link(:nope)
      assert m =~ "keyword list"
    end

    test "every option the core reads is accepted" do
      e =
        start_engine(
          node_id: "errors-test-#{unique()}",
          queues: %{"default" => 2, other: 1},
          concurrency_limits: [stripe: %{limit: 2, shards: 2}],
          rate_limits: [{"openai", [limit: 10, period: 1000, burst: 2]}],
          gc_interval: 1000,
          connect_timeout: 5000,
          retention: :infinity,
          prefetch: 0,
          workflows: [Steps]
        )

      assert {:ok, _} = GenDurable.insert(Steps, engine: e, concurrency_key: "stripe:1")
    end

    test "an unreachable database is a clear error at start" do
      Process.flag(:trap_exit, true)

      assert {:error, %Error{kind: kind, message: m} = e} =
               GenDurable.start_link(
                 name: :"unreachable_#{unique()}",
                 url: "postgres://nobody@127.0.0.1:1/none"
               )

      assert kind in [:database, :migrate]
      assert m != ""
      assert e.transient == (kind == :database), inspect(e)
    end

    test "a statement the database refused is not transient" do
      opts = engine_opts(workflows: [Steps])
      start_supervised!({GenDurable, opts})

      sql(
        ~s(ALTER TABLE "#{opts[:schema]}".instances ) <>
          "ADD CONSTRAINT refused CHECK (NOT state ? 'refused')"
      )

      assert {:error, %Error{kind: :database, transient: false, message: m}} =
               GenDurable.insert(Steps, engine: opts[:name], state: %{"refused" => true})

      assert m =~ "refused"
    end
  end
end

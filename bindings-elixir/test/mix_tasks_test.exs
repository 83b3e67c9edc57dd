defmodule GenDurable.MixTasksTest do
  # mix gendurable.status prints what the Rust CLI's `gendurable status`
  # prints, reading through the core; on a schema that does not exist it
  # says so in one line and creates nothing. mix gendurable.migrate creates
  # the schema.
  use ExUnit.Case, async: true
  import ExUnit.CaptureIO
  import GenDurable.TestHelper

  alias GenDurableTest.Steps
  alias Mix.Tasks.Gendurable.{Migrate, Status}

  @cli Path.expand("../../target/debug/gendurable", __DIR__)

  setup_all do
    root = Path.expand("../..", __DIR__)

    {out, status} =
      System.cmd("cargo", ["build", "-q", "--bin", "gendurable"], cd: root, stderr_to_stdout: true)

    assert status == 0, "building the CLI failed:\n" <> out
    :ok
  end

  defp schema_exists?(schema),
    do: sql("SELECT count(*) FROM pg_namespace WHERE nspname = '#{schema}'") == ["1"]

  test "status on a schema that does not exist says so and creates nothing" do
    schema = "ex_none#{unique()}"

    e = assert_raise Mix.Error, fn -> Status.run(["--url", url(), "--schema", schema]) end

    assert e.message ==
             ~s|no gendurable schema "#{schema}" in this database (nothing was created); | <>
               "`mix gendurable.migrate --schema #{schema}` creates it"

    refute schema_exists?(schema)

    assert capture_io(fn -> Migrate.run(["--url", url(), "--schema", schema]) end) ==
             ~s(schema "#{schema}" is up to date\n)

    assert schema_exists?(schema)
    assert capture_io(fn -> Status.run(["--url", url(), "--schema", schema]) end) =~ "instances"
  end

  test "status prints what the Rust CLI prints" do
    opts = engine_opts(workflows: [Steps], queues: [])
    schema = opts[:schema]
    start_supervised!({GenDurable, opts})

    for q <- ["default", "mail", "default"] do
      GenDurable.insert!(Steps, queue: q, concurrency_key: "stripe:1", engine: opts[:name])
    end

    GenDurable.insert!("Other.Workflow", schedule_in: 60_000, engine: opts[:name])

    args = ["--url", url(), "--schema", schema, "--key", "stripe:1", "--gate", "stripe=10/2"]
    args = args ++ ["--key", "account:7"]
    {rust, 0} = System.cmd(@cli, ["status" | args])
    elixir = capture_io(fn -> Status.run(args) end)

    assert elixir == rust
    assert elixir =~ "Other.Workflow"
    assert elixir =~ "stripe:1: K = 10 (captured by gate \"stripe\", 2 shards)"
  end

  test "bad options" do
    assert_raise Mix.Error, ~r/invalid option --colour/, fn -> Status.run(["--colour"]) end

    assert_raise Mix.Error, ~r/unexpected argument "x"/, fn ->
      Status.run(["--url", url(), "x"])
    end

    assert_raise Mix.Error, ~r/invalid key/, fn ->
      Status.run(["--url", url(), "--key", ":nameless"])
    end

    assert_raise Mix.Error, ~r/NAME=LIMIT/, fn -> Status.run(["--url", url(), "--gate", "g"]) end
    assert_raise Mix.Error, ~r/seconds/, fn -> Migrate.run(["--connect-timeout", "0"]) end
  end
end

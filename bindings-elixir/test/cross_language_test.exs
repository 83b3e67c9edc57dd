defmodule GenDurable.CrossLanguageTest do
  # An instance inserted by the Rust CLI (`gendurable insert`) under the
  # workflow name "Account.Sync" runs on the Elixir module Account.Sync.
  use ExUnit.Case, async: true
  import GenDurable.TestHelper

  @cli Path.expand("../../target/debug/gendurable", __DIR__)

  setup_all do
    root = Path.expand("../..", __DIR__)

    {out, status} =
      System.cmd("cargo", ["build", "-q", "--bin", "gendurable"], cd: root, stderr_to_stdout: true)

    assert status == 0, "building the CLI failed:\n" <> out
    :ok
  end

  test "an instance inserted from Rust runs on an Elixir worker" do
    schema = "ex_x#{unique()}"
    engine = start_engine(workflows: [Account.Sync], schema: schema)
    t = register()
    state = ~s({"account": 42, "test": "#{t}"})

    {out, 0} =
      System.cmd(@cli, [
        "insert",
        "--url",
        url(),
        "--schema",
        schema,
        "--workflow",
        "Account.Sync",
        "--state",
        state,
        "--concurrency-key",
        "account:42"
      ])

    id = out |> String.trim() |> String.to_integer()
    assert_receive {:gd, ^id, "start", ctx, _}, 30_000
    assert ctx.workflow == "Account.Sync"
    assert ctx.concurrency_key == "account:42"
    assert_receive {:gd, ^id, "finish", _, _}, 30_000
    i = wait_status(engine, id, :completed)
    assert i.state == %{"account" => 42, "test" => t, "synced_by" => "elixir"}
  end
end

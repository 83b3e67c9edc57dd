defmodule Mix.Tasks.Gendurable.Status do
  @shortdoc "Shows the cluster: instances, live nodes, waiting rows, gates, keys (read-only)"

  @moduledoc """
  Prints what the Rust command line's `gendurable status` prints, read
  through the engine's core: instances per queue and status, live nodes,
  waiting rows per workflow and queue (flagging those no live node will
  run), gates, executing K = 1 keys and rate-limit state.

      mix gendurable.status [--url URL] [--schema NAME] [--key KEY]... [--gate NAME=LIMIT[/SHARDS]]...

  Options:

    * `--url` — the database (default: the `DATABASE_URL` variable)
    * `--schema` — the schema holding the engine's tables (default `gendurable`)
    * `--key` — also show the effective K of this concurrency key (repeatable)
    * `--gate` — a gate as configured on the nodes, for `--key`: `NAME=LIMIT`
      or `NAME=LIMIT/SHARDS` (repeatable)
    * `--connect-timeout` — seconds to wait for a connection (default 10)

  Read-only: it never creates or changes anything. If the schema does not
  exist, it says so and exits with status 1; `mix gendurable.migrate`
  creates it.
  """

  use Mix.Task

  alias GenDurable.Native

  @impl true
  def run(args) do
    {db, opts} = GenDurable.MixTask.parse!(args, key: :keep, gate: :keep)
    keys = Keyword.get_values(opts, :key)
    gates = Keyword.get_values(opts, :gate)

    GenDurable.MixTask.call!(
      &Native.status(db.url, db.schema, keys, gates, db.connect_timeout, &1)
    )
    |> IO.write()
  end
end

defmodule Mix.Tasks.Gendurable.Migrate do
  @shortdoc "Creates or upgrades the engine's schema"

  @moduledoc """
  Creates or upgrades the engine's schema, as the Rust command line's
  `gendurable migrate` does (idempotent; safe from many nodes at once).

      mix gendurable.migrate [--url URL] [--schema NAME] [--connect-timeout SECONDS]

  Options:

    * `--url` — the database (default: the `DATABASE_URL` variable)
    * `--schema` — the schema to create or upgrade (default `gendurable`)
    * `--connect-timeout` — seconds to wait for a connection (default 10)

  An engine started with `{GenDurable, ...}` migrates its schema itself;
  this task is for deployments that migrate first.
  """

  use Mix.Task

  alias GenDurable.Native

  @impl true
  def run(args) do
    {db, _opts} = GenDurable.MixTask.parse!(args, [])

    GenDurable.MixTask.call!(&Native.migrate(db.url, db.schema, db.connect_timeout, &1))
    |> IO.write()
  end
end

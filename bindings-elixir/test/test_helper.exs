# A real DATABASE_URL wins; otherwise a throwaway PostgreSQL for the run.
{:ok, url, pg} = GenDurable.TempPostgres.url_or_start()
Application.put_env(:gen_durable, :test_url, url)
:persistent_term.put({:gen_durable_test, :pg}, pg)
:ets.new(:gd_test, [:public, :named_table, :set, write_concurrency: true])

ExUnit.after_suite(fn _ ->
  if pg, do: GenDurable.TempPostgres.stop(pg)
end)

# Logs (a step that fails is a warning) are shown for failed tests only.
ExUnit.start(capture_log: true)

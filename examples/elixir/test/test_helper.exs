# The tests run against DATABASE_URL when it is set, otherwise against a
# throwaway PostgreSQL started for the run.
{:ok, url, pg} = GenDurable.TempPostgres.url_or_start()
Application.put_env(:orders, :database_url, url)
if pg, do: ExUnit.after_suite(fn _ -> GenDurable.TempPostgres.stop(pg) end)
ExUnit.start()

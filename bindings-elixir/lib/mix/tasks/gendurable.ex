defmodule GenDurable.MixTask do
  @moduledoc false
  # What the gendurable.* Mix tasks share: the database options, loading
  # the project (not starting it), calling the core and reporting an error
  # as one line.

  alias GenDurable.{Error, Native}

  @db_switches [url: :string, schema: :string, connect_timeout: :string]

  @doc false
  # {%{url, schema, connect_timeout (ms)}, other options}; raises Mix.Error.
  def parse!(args, switches) do
    {opts, rest, invalid} = OptionParser.parse(args, strict: @db_switches ++ switches)

    case {rest, invalid} do
      {[], []} -> :ok
      {[arg | _], _} -> Mix.raise("unexpected argument #{inspect(arg)}")
      {_, [{opt, _} | _]} -> Mix.raise("invalid option #{opt}")
    end

    timeout = connect_timeout(Keyword.get(opts, :connect_timeout, "10"))

    url =
      opts[:url] || non_empty(System.get_env("DATABASE_URL")) ||
        Mix.raise("no database: pass --url or set DATABASE_URL")

    Mix.Task.run("app.config")

    {%{url: url, schema: Keyword.get(opts, :schema, "gendurable"), connect_timeout: timeout},
     opts}
  end

  @doc false
  # Calls an asynchronous NIF; its {:ok, text}'s text, or Mix.raise.
  def call!(fun) do
    case Native.call(fun) do
      {:ok, text} -> text
      {:error, e} -> Mix.raise(Error.from_native(e).message)
    end
  end

  defp non_empty(""), do: nil
  defp non_empty(s), do: s

  defp connect_timeout(s) do
    case Float.parse(s) do
      {secs, ""} when secs > 0 -> round(secs * 1000)
      _ -> Mix.raise("--connect-timeout: expected a number of seconds above zero, got #{s}")
    end
  end
end

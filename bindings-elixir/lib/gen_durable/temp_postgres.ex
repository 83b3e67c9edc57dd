defmodule GenDurable.TempPostgres do
  @moduledoc """
  A throwaway PostgreSQL server, started from the server programs installed
  on this machine (`initdb`, `pg_ctl`) in a temporary directory, for tests,
  examples and demos.

      {:ok, pg} = GenDurable.TempPostgres.start()
      children = [{GenDurable, url: pg.url, queues: [default: 10], workflows: [MyFlow]}]

  The server stops when `stop/1` is called, when the handle is
  garbage-collected, or (through a watchdog process) when the VM dies. Keep
  the struct referenced for as long as the server is in use: a variable
  that is never used again may be collected early.
  `url_or_start/0` prefers a real `DATABASE_URL`.
  """

  alias GenDurable.{Error, Native}

  defstruct [:url, :handle]

  @type t :: %__MODULE__{url: String.t(), handle: reference}

  @doc "Starts a server; returns `{:ok, %GenDurable.TempPostgres{url: url}}`."
  @spec start() :: {:ok, t} | {:error, Error.t()}
  def start do
    case Native.call(&Native.temp_postgres_start/1) do
      {:ok, {handle, url}} -> {:ok, %__MODULE__{url: url, handle: handle}}
      {:error, e} -> {:error, Error.from_native(e)}
    end
  end

  @doc """
  `{:ok, url, nil}` when `DATABASE_URL` is set, otherwise starts a server:
  `{:ok, url, %GenDurable.TempPostgres{}}` (keep it referenced while in use).
  """
  @spec url_or_start() :: {:ok, String.t(), t | nil} | {:error, Error.t()}
  def url_or_start do
    case System.get_env("DATABASE_URL") do
      url when is_binary(url) and url != "" ->
        {:ok, url, nil}

      _ ->
        with {:ok, pg} <- start(), do: {:ok, pg.url, pg}
    end
  end

  @doc "Stops the server and deletes its files."
  @spec stop(t) :: :ok
  def stop(%__MODULE__{handle: handle}), do: Native.temp_postgres_stop(handle)
end

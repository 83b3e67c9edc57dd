defmodule GenDurable.Error do
  @moduledoc """
  The error returned (`{:error, %GenDurable.Error{}}`) or raised (by the bang
  variants) by every `GenDurable` function.

  * `:kind` says what went wrong:
    * `:invalid_input` — an argument was refused; nothing was written.
      `:field` names it (`:state`, `:queue`, `:concurrency_key`, ...).
    * `:invalid_config` — the engine's configuration was refused.
    * `:not_found` — no instance has this id.
    * `:not_running` — no engine of that name is running.
    * `:shut_down` — the engine is shutting down.
    * `:database` — the database failed or refused a statement, or the
      connection broke.
    * `:contended` — concurrent writers kept a call from finishing (a
      unique insert whose conflicting instances kept finishing under it);
      nothing was written. Retrying succeeds.
    * `:migrate`, `:embedded`, `:internal` — schema migrations, the
      throwaway PostgreSQL, or a bug.
  * `:message` is a sentence for humans.
  * `:transient` is true when retrying later may succeed: a broken
    connection, a server restarting or taking no writes, a deadlock, a lock
    or statement timeout, or `:contended`.

  ## Example

      case GenDurable.insert(MyApp.Sync, state: [1, 2]) do
        {:ok, id} -> id
        {:error, %GenDurable.Error{kind: :invalid_input, field: :state} = e} -> raise e
      end

      # or, raising the same error:
      GenDurable.insert!(MyApp.Sync, state: [1, 2])
  """

  defexception [:kind, :field, :message, transient: false]

  @type t :: %__MODULE__{
          kind: atom,
          field: atom | nil,
          message: String.t(),
          transient: boolean
        }

  @doc false
  def from_native({kind, field, message, transient}) do
    %__MODULE__{kind: kind, field: field_atom(field), message: message, transient: transient}
  end

  @doc false
  def input(field, message), do: %__MODULE__{kind: :invalid_input, field: field, message: message}

  @doc false
  def config(message), do: %__MODULE__{kind: :invalid_config, message: message}

  defp field_atom(nil), do: nil
  defp field_atom(f) when is_binary(f), do: String.to_atom(f)
  defp field_atom(f), do: f
end

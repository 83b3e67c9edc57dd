defmodule GenDurable.Instance do
  @moduledoc """
  An instance as stored, returned by `GenDurable.get/2`.

  `:status` is one of `:scheduled`, `:available`, `:executing`, `:awaiting`,
  `:completed`, `:cancelled` and `:discarded`. `:errors` lists the recorded
  errors (maps with string keys, newest last). Timestamps are UTC `DateTime`s.
  """

  defstruct [
    :id,
    :workflow,
    :step,
    :state,
    :queue,
    :priority,
    :status,
    :concurrency_key,
    :rate_limit,
    :attempt,
    :max_attempts,
    :node,
    :cancel_requested,
    :await_signal,
    :await_until,
    :errors,
    :inserted_at,
    :scheduled_at,
    :attempted_at,
    :finished_at
  ]

  @type status ::
          :scheduled | :available | :executing | :awaiting | :completed | :cancelled | :discarded

  @type t :: %__MODULE__{
          id: integer,
          workflow: String.t(),
          step: String.t(),
          state: map,
          queue: String.t(),
          priority: 0..9,
          status: status,
          concurrency_key: String.t() | nil,
          rate_limit: String.t() | nil,
          attempt: non_neg_integer,
          max_attempts: pos_integer,
          node: String.t() | nil,
          cancel_requested: boolean,
          await_signal: String.t() | nil,
          await_until: DateTime.t() | nil,
          errors: [map],
          inserted_at: DateTime.t(),
          scheduled_at: DateTime.t(),
          attempted_at: DateTime.t() | nil,
          finished_at: DateTime.t() | nil
        }

  @doc false
  def from_native(%__MODULE__{} = i) do
    %{
      i
      | await_until: time(i.await_until),
        inserted_at: time(i.inserted_at),
        scheduled_at: time(i.scheduled_at),
        attempted_at: time(i.attempted_at),
        finished_at: time(i.finished_at)
    }
  end

  defp time(nil), do: nil
  defp time(us), do: DateTime.from_unix!(us, :microsecond)
end

defmodule GenDurable.Context do
  @moduledoc """
  What a step may want to know about the instance it runs for; the third
  argument of `c:GenDurable.handle_step/3`.

  * `:id` — the instance id
  * `:workflow` — the workflow name (`"Account.Sync"`)
  * `:queue` — the queue it runs in
  * `:attempt` — this step's attempt, from 1; `:max_attempts` — attempts allowed
  * `:concurrency_key` — the key held while this step runs, or `nil`
  * `:rate_limit` — the rate-limit key the step was admitted under (given
    by the transition or the insert, or declared for the step with `use
    GenDurable, rate_limits: %{step => key}`), or `nil`
  * `:wake` — why the step was woken after an `:await`: `{:signal, name,
    payload}`, `:timeout`, or `nil` when it did not follow an await
  """

  defstruct [
    :id,
    :workflow,
    :queue,
    :attempt,
    :max_attempts,
    :concurrency_key,
    :rate_limit,
    :wake
  ]

  @type t :: %__MODULE__{
          id: integer,
          workflow: String.t(),
          queue: String.t(),
          attempt: pos_integer,
          max_attempts: pos_integer,
          concurrency_key: String.t() | nil,
          rate_limit: String.t() | nil,
          wake: nil | :timeout | {:signal, String.t(), term}
        }
end

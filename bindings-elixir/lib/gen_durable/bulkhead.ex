defmodule GenDurable.Bulkhead do
  @moduledoc """
  A per-service concurrency limit (a bulkhead) for calls to an external
  service from this node.

  A rate limit bounds how often calls start and a circuit breaker how many
  may fail; neither bounds how many are *in flight at once*. When a service
  slows down without failing, that is the number that grows: every caller
  parks in the slow call, holding a process and usually a pooled connection.
  A bulkhead caps it.

      :ok = GenDurable.Bulkhead.configure(:geocoder, limit: 20, reclaim_after: 30_000)

      case GenDurable.Bulkhead.call(:geocoder, fn -> Geocoder.lookup(address) end) do
        {GenDurable.Bulkhead, :saturated} -> {:snooze, 1_000}
        {:ok, point} -> {:done, Map.put(state, "point", point)}
      end

  Over the limit, `call/2` does not run the function and returns
  `{GenDurable.Bulkhead, :saturated}` at once: that is backpressure, not an
  error; the caller may retry later, serve something stale or shed the
  request. With `wait: ms` a call first waits up to that long for a slot
  (waiting callers hold no slot, and waiting never blocks a scheduler).
  An unbounded wait (`:infinity`) is refused: it is the pile-up a bulkhead
  exists to prevent.

  A service that was never configured has no limit: `call/2` runs the
  function directly, `in_flight/1` is 0 and `limit/1` is `nil`.

  ## Slots, and why `:reclaim_after` is required

  The slots live in the Rust core as one atomic word per permit, holding the
  monotonic deadline until which it counts as taken. Taking and releasing a
  slot are compare-and-exchange operations of a few tens of nanoseconds; no
  process or ETS table is involved.

  A slot is released in an `after` block, so returning, raising, throwing
  and exiting all release it. A process killed from outside (an exit signal,
  including a supervisor's `:shutdown`) never runs `after`; its slot is then
  released when the permit, a NIF resource, is garbage-collected, which
  normally happens as the process dies. If the permit outlives its owner
  anyway, or the release is lost, the slot stays taken only until
  `:reclaim_after` milliseconds after it was taken: then it counts as
  abandoned and the next caller reuses it. Pick `:reclaim_after` longer than
  any legitimate call (your client's timeout): reclaiming a slow call's slot
  briefly admits more than `:limit`. A release from a call whose slot was
  reclaimed does not free the new holder's slot.

  The limit is per node (per BEAM), not cluster-wide; for cluster-wide
  limits use concurrency keys and gates (see `GenDurable`).
  """

  alias GenDurable.{Error, Native}

  @typedoc "A service: an atom, a string or any term (keyed by `inspect/1`)."
  @type service :: term

  @typedoc "Returned by `call/2` when no slot was available."
  @type saturated :: {GenDurable.Bulkhead, :saturated}

  @doc """
  Configures (or replaces) the bulkhead of `service`.

  Options:

    * `:limit` (required) — how many calls may be in flight at once
    * `:reclaim_after` (required) — milliseconds after which a slot that was
      never released counts as free again
    * `:wait` — `false` (default: shed at once) or a budget in milliseconds

  Replacing a bulkhead does not touch calls running under the old one.
  """
  @spec configure(service, keyword) :: :ok | {:error, Error.t()}
  def configure(service, opts) do
    with :ok <- known(opts),
         {:ok, limit} <- required_pos(opts, :limit),
         {:ok, reclaim} <- required_pos(opts, :reclaim_after),
         {:ok, wait} <- wait(Keyword.get(opts, :wait, false)) do
      case Native.bulkhead_configure(key(service), limit, reclaim, wait) do
        :ok -> :ok
        {:error, e} -> {:error, Error.from_native(e)}
      end
    end
  end

  @doc "Like `configure/2`, raising `GenDurable.Error`."
  def configure!(service, opts) do
    case configure(service, opts) do
      :ok -> :ok
      {:error, e} -> raise e
    end
  end

  @doc """
  Runs `fun` under a slot of `service` and returns its value, or returns
  `{GenDurable.Bulkhead, :saturated}` without running it.
  """
  @spec call(service, (() -> result)) :: result | saturated when result: term
  def call(service, fun) when is_function(fun, 0) do
    ref = make_ref()

    case Native.bulkhead_acquire(key(service), ref) do
      {:ok, permit} -> run(permit, fun)
      :saturated -> {__MODULE__, :saturated}
      :none -> fun.()
      :wait -> waited(Native.await(ref), fun)
    end
  end

  defp waited({:ok, permit}, fun), do: run(permit, fun)
  defp waited(:saturated, _fun), do: {__MODULE__, :saturated}

  defp run(permit, fun) do
    fun.()
  after
    Native.bulkhead_release(permit)
  end

  @doc "How many of `service`'s slots are taken now; 0 for an unknown service."
  @spec in_flight(service) :: non_neg_integer
  def in_flight(service), do: Native.bulkhead_in_flight(key(service))

  @doc "The configured limit of `service`, or `nil` if it has none."
  @spec limit(service) :: pos_integer | nil
  def limit(service), do: Native.bulkhead_limit(key(service))

  @doc """
  Frees every slot of `service`, as if every holder had released.

  Running calls are not stopped, only forgotten (their releases then do
  nothing); until they finish the service may see up to twice the limit.
  Meant for tests and for clearing slots after an incident.
  """
  @spec reset(service) :: :ok | {:error, :not_found}
  def reset(service) do
    case Native.bulkhead_reset(key(service)) do
      :ok -> :ok
      :not_found -> {:error, :not_found}
    end
  end

  defp key(s) when is_binary(s), do: s
  defp key(s) when is_atom(s), do: Atom.to_string(s)
  defp key(s), do: inspect(s)

  defp known(opts) do
    cond do
      not (is_list(opts) and Keyword.keyword?(opts)) ->
        {:error, Error.config("bulkhead options must be a keyword list, got: #{inspect(opts)}")}

      (unknown = Keyword.keys(opts) -- [:limit, :reclaim_after, :wait]) != [] ->
        {:error,
         Error.config(
           "unknown bulkhead option #{inspect(hd(unknown))}; known: :limit, :reclaim_after, :wait"
         )}

      true ->
        :ok
    end
  end

  defp required_pos(opts, key) do
    case Keyword.fetch(opts, key) do
      {:ok, n} when is_integer(n) and n > 0 ->
        {:ok, n}

      {:ok, n} ->
        {:error,
         Error.config("bulkhead #{inspect(key)} must be a positive integer, got: #{inspect(n)}")}

      :error ->
        {:error, Error.config("bulkhead #{inspect(key)} is required")}
    end
  end

  defp wait(false), do: {:ok, nil}
  defp wait(0), do: {:ok, nil}
  defp wait(ms) when is_integer(ms) and ms > 0, do: {:ok, ms}

  defp wait(:infinity),
    do:
      {:error,
       Error.config(
         "bulkhead :wait of :infinity is not allowed: an unbounded wait is the pile-up a bulkhead prevents; give a budget in milliseconds, or false"
       )}

  defp wait(other),
    do:
      {:error,
       Error.config(
         "bulkhead :wait must be false or non-negative milliseconds, got: #{inspect(other)}"
       )}
end

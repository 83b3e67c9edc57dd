defmodule GenDurable do
  @moduledoc """
  A durable step engine on PostgreSQL, run by a Rust core inside the BEAM.

  A workflow is a module with one callback, `c:handle_step/3`, called with
  the name of the instance's current step, its state (a map with string
  keys, stored as JSON) and a `GenDurable.Context`. It returns the
  instance's next move. Each instance is a row; the engine claims runnable
  rows, runs their step in a supervised Elixir process and writes the
  transition back in one transaction.

      defmodule Account.Sync do
        use GenDurable

        @impl true
        def handle_step("start", state, _ctx) do
          {:next, "fetch", Map.put(state, "page", 1)}
        end

        def handle_step("fetch", %{"page" => page} = state, _ctx) when page < 3 do
          {:next, "fetch", %{state | "page" => page + 1}}
        end

        def handle_step("fetch", state, _ctx) do
          # Release the account's key and wait for the user's approval.
          {:await, "approved", state, signal: "approve:\#{state["account"]}", timeout: 60_000}
        end

        def handle_step("approved", state, %GenDurable.Context{wake: :timeout}) do
          {:cancel, "not approved in time"}
        end

        def handle_step("approved", state, _ctx), do: {:done, state}
      end

  The workflow is stored under the module's name without `Elixir.`
  (`"Account.Sync"`), so an instance inserted from Rust or Python under that
  name runs on this module.

  ## Starting the engine

  Put the engine in your supervision tree:

      children = [
        {GenDurable,
         url: "postgres://localhost/app",
         queues: [default: 10, mailers: 5],
         concurrency_limits: [stripe: [limit: 100, shards: 10]],
         rate_limits: [openai: [limit: 100, period: 60_000, burst: 10]],
         workflows: [Account.Sync]}
      ]

      Supervisor.start_link(children, strategy: :one_for_one)

  Options:

    * `:name` — the engine's name (default `GenDurable`); client calls take
      it as `engine: name`.
    * `:url` — the database URL (default: the `DATABASE_URL` variable).
    * `:schema` — the schema holding the engine's tables (default `"gendurable"`).
    * `:queues` — `[queue: concurrency]`: how many steps of each queue this
      node runs at once. Without queues the engine only inserts, signals and
      cancels.
    * `:concurrency_limits` — `[name: [limit: k, shards: s]]`: keys named
      `name` (`"name:..."`) may run `k` steps at once, cluster-wide. Every
      other concurrency key is a mutex (K = 1). A name captures every key
      with that prefix: `order` gates `order:1` and `order:2` alike.
    * `:rate_limits` — `[name: [limit: n, period: ms, burst: b]]`: steps
      carrying a rate-limit key named `name` start at most `n` per period.
      Every key a workflow declares with `use GenDurable, rate_limits:` must
      be named here.
    * `:workflows` — the workflow modules this node runs.
    * `:cron` — periodic workflows: a list of `{schedule, workflow, opts}`.
      See "Periodic workflows" below.
    * `:step_timeouts` — `[{"Workflow", %{"step" => ms}}]`, for workflows
      that do not declare their own (see "Step timeouts" below).
    * `:inline` — `true` in unit tests: every insert runs the queues it
      inserted into to the end before it returns. See `GenDurable.Testing`.
    * `:poll_interval`, `:heartbeat_interval`, `:lease`, `:shutdown_timeout`,
      `:gc_interval`, `:connect_timeout`, `:call_timeout` (how long a call
      waits for the database's answer to one statement, default 60 s) —
      milliseconds; `:backoff` —
      `[base: ms, max: ms]` for retries; `:retention` — how long finished
      instances are kept (ms or `:infinity`); `:node_id`; `:pool_size` —
      database connections; `:prefetch` — the most rows a queue claims
      ahead of its free slots.
    * `:metrics_listen` — `"127.0.0.1:9090"`: serve the metrics (see
      `metrics/1`) on `GET /metrics` there while the node runs; port 0 takes
      a free port, which `metrics_addr/1` tells.

  The options are the Rust core's (`gendurable::options`), read from a map:
  keyword lists become maps and atoms strings. The core checks every one
  before anything starts: an unknown option, a wrong type or a bad value (a
  limit below 1, a lease shorter than two heartbeats, ...) and the engine
  does not start; the error is a `GenDurable.Error` whose message names the
  option, such as `engine option queues.default: expected a positive
  integer, got -1`. A name given twice in a keyword list is refused too.

  When its supervisor stops it, the engine stops picking, lets running steps
  finish within `:shutdown_timeout` (default 15 s), kills the processes of
  those still running then and hands back what never started.

  The engine's processes (`<name>.Engine`, `<name>.Dispatcher` and the step
  processes' owner `<name>.Tasks`) are restarted alone if one dies.
  The node belongs to the Engine process: if it is killed, the node stops
  gracefully and the next Engine starts a new one once it has. A killed
  dispatcher loses no step. If the whole tree is killed, your supervisor
  starts a new one, which waits for the old processes to be gone. A step
  that could not be started is snoozed (not an attempt), never failed.

  ## Steps

  `c:handle_step/3` returns one of:

    * `{:next, step, state}` or `{:next, step, state, opts}` — run `step`
      next. Options: `concurrency_key: nil` releases the instance's key,
      `concurrency_key: key` switches to another one (admitted at the next
      claim); `rate_limit: key`; `schedule_in: ms` delays the next step.
      Without `:concurrency_key` the key is kept.
    * `{:done, state}` — finished.
    * `{:await, step, state, opts}` — park (holding no slot and no key)
      until `signal: name` arrives (see `signal/3`), `timeout: ms` passes or
      `until: %DateTime{}`; then run `step`, whose context's `:wake` says why.
    * `{:snooze, ms}` — run the same step again later; not an attempt.
    * `{:error, reason}` — retried with exponential backoff until
      `max_attempts`, then discarded.
    * `{:discard, reason}` — a permanent error (a request that will never
      be accepted): discarded now, whatever attempts are left, not retried.
      The error is recorded with kind `"discard"`.
    * `{:cancel, reason}` — stop for good.

  A raise, a throw or an exit in the step is an error outcome recording the
  formatted exception and stacktrace. So is a step process killed from
  outside, or a return value that is none of the above. Steps run in
  processes owned by the engine, at most each queue's concurrency at once;
  they never take the VM down. A process runs one step after another while
  the steps leave it as it started (see the README: a step that changes its
  process dictionary, links, monitors, mailbox, flags or registered name
  ends it, and the next step gets a fresh process). A step the engine stops
  (past its timeout, its instance cancelled, still running at the shutdown
  timeout, or its claim lost while the node was presumed dead) has its
  process killed.

  ## Signals

  A step that returns `{:await, step, state, signal: name}` parks until
  the signal comes. Signals are kept until they are consumed, so a sender
  never has to poll for the await:

    * `send/4` — to one instance: if it is awaiting, it wakes now; if it
      has not reached its await yet, the signal is kept in its mailbox and
      delivered the moment it awaits `name`, in the order sent, each once.
      Returns `{:ok, :woken | :kept | {:finished, status}}`.
    * `signal/3` — to every instance awaiting `name` now; nothing is kept.
      With `ttl: ms`, a signal that woke nobody is kept that long for the
      first instance that awaits `name`.

  ## Concurrency keys

  A concurrency key (`"account:42"`, or `{:account, 42}`) lets at most one
  step of that key run at a time across every node, unless its name is a
  gate in `:concurrency_limits`. Keys are held across steps until a
  transition releases or switches them; an await does not hold its key.
  The database enforces the limits: no node can break them.

  ## Rate limits per step

  A step that calls a rate-limited service can declare its key once, in
  the workflow module, instead of in every transition that leads to it:

      defmodule Summarize do
        use GenDurable, rate_limits: %{"call_api" => "openai:default"}

        @impl true
        def handle_step("start", state, _ctx), do: {:next, "call_api", state}

        def handle_step("call_api", state, ctx) do
          # ctx.rate_limit == "openai:default"
          {:done, state}
        end
      end

  Options of `use GenDurable`:

    * `:rate_limits` — a map of step names (strings) to rate-limit keys
      (strings, `"name"` or `"name:rest"`). Whenever an instance moves to
      one of these steps (`:next` or `:await`), or is inserted at it,
      without an explicit `rate_limit:`, the step's key applies; an explicit
      `rate_limit:` wins.

  A declaration that is not a map of strings raises `ArgumentError` when the
  module is compiled. Each key's name must be configured in the engine's
  `:rate_limits`: otherwise the engine does not start and the error (a
  `GenDurable.Error` of kind `:invalid_config`) names the workflow, the
  step and the key.

  ## Defaults per workflow

  A workflow can declare the queue, priority and attempts its instances get
  when an insert does not name them, and how its errors are retried:

      defmodule Charge do
        use GenDurable, queue: "billing", priority: 2, max_attempts: 5, backoff: {1_000, 60_000}

        @impl true
        def handle_step("start", state, _ctx), do: {:done, state}
      end

  Options of `use GenDurable`, each optional:

    * `:queue`, `:priority` (0 to 9), `:max_attempts` — what an insert of
      the workflow gets when it does not give its own. An insert's own
      option wins, then the workflow's, then the engine's (`"default"`, 0,
      20), whether the insert names the workflow by its module or by its
      name.
    * `:backoff` — `{base, max}` in milliseconds (here 1 s doubling up to
      60 s): how this workflow's errors are retried, instead of the
      engine's `:backoff`.

  The engine passes them to the core as its `workflow_defaults` option for
  each module in `:workflows`. The core checks the values when the engine
  starts: a bad one and the engine does not start, with a `GenDurable.Error`
  of kind `:invalid_config` naming the workflow and the option
  (`workflow_defaults "Charge": invalid priority: must be 0 to 9, got 12`).
  Inserts take the defaults through an engine whose `:workflows` lists the
  module, and retries take the backoff on the nodes that run it: every node
  running a workflow should declare the same defaults.

  ## Step timeouts

  A workflow can bound how long its steps run:

      defmodule Payments.Capture do
        use GenDurable, timeout: 30_000, step_timeouts: %{"capture" => 10_000}

        @impl true
        def handle_step("start", state, _ctx), do: {:next, "capture", state}
        def handle_step("capture", state, _ctx), do: {:done, PSP.capture!(state)}
      end

    * `:timeout` (ms) — every step of the workflow;
    * `:step_timeouts` — `%{step => ms}` for the steps named, winning over
      `:timeout`.

  At the deadline the step's process is **killed** (`Process.exit(pid,
  :kill)`: processes linked to it, such as its `Task.async/1` tasks, go
  with it) and the step is an error of kind `"timeout"` (`step "capture"
  timed out after 10s` in the instance's `:errors`), retried with backoff
  like any error and discarded after `max_attempts`. The timeout is
  measured by the node running the step, from its start; an answer the
  step would send after it is ignored.

  They become the core's `workflow_defaults` (`timeout`) and
  `step_timeouts` options for each module in `:workflows`, checked when
  the engine starts. `:step_timeouts` must be a map of step names
  (strings) to positive integers, checked when the module is compiled.

  Cancelling an executing instance (`cancel/2`) kills its step's process
  the same way; its outcome records the cancellation.

  ## Periodic workflows

  The engine's `:cron` option inserts an instance at every tick of a
  schedule; every node that runs the engine with the entry tries, and the
  database inserts each tick once, cluster-wide:

      {GenDurable,
       url: url,
       queues: [default: 10],
       workflows: [Reports.Daily, Cleanup],
       cron: [
         {"0 6 * * *", Reports.Daily,
          state: %{"kind" => "daily"}, name: "daily-report", timezone: "Europe/Paris"},
         {"*/10 * * * * *", Cleanup, queue: "maintenance", missed: :skip}
       ]}

  Each entry is `{schedule, workflow}` or `{schedule, workflow, opts}`:

    * `schedule` — five cron fields (minute to day of week), or six with
      seconds first, or `@hourly`, `@daily`, ...: see docs/cron.md.
    * `workflow` — a module using `GenDurable`, or a workflow name.
    * `:name` — the entry's name, which matches it across nodes (default:
      the workflow's name; two entries of a workflow need names).
    * `:timezone` — an IANA time zone (default UTC).
    * `:missed` — ticks that passed while no node ran the entry:
      `:latest` (default: the latest one, once), `:all` or `:skip`.
    * any option of `insert/2` but `:engine`, `:schedule_in` and
      `:scheduled_at` (`:state`, `:queue`, `:priority`,
      `:concurrency_key`, `:unique`, ...): the instance inserted, scheduled
      at the tick's time. The workflow's defaults apply as to any insert.

  The core checks the entries when the engine starts; an error names the
  entry: `engine option cron[0].missed: expected "latest", "all" or
  "skip", got "never"`.

  ## Testing

  `GenDurable.Testing` runs a queue's instances to their end in a test
  (`drain_queue/2`) and asserts on what was inserted (`assert_inserted/2`,
  `refute_inserted/2`); the engine option `inline: true` runs each insert's
  queues before the insert returns.

  ## Operating

  `pause_queue/2` stops every node claiming from a queue until
  `resume_queue/2` (`paused_queues/1` lists them); `count/2`,
  `cancel_where/2`, `retry_where/2` and `delete_where/2` act on the
  instances keyword conditions name (`ids:`, `workflow:`, `queue:`,
  `status:`, `key:`, `error:`) and return `{:ok, %{matched: n, changed:
  n}}`; `retry/2` and `delete/2` act on one.

  ## Metrics and logs

  The engine option `metrics_listen: "127.0.0.1:9090"` serves the metrics
  in the Prometheus text format on `GET /metrics`; `metrics/1` returns the
  same text. A step that returns or raises an error, or discards, is logged
  as a warning; with the `:telemetry` package loaded, each step emits
  `[:gen_durable, :step, :start]` and `[:gen_durable, :step, :stop]` (or
  `:exception` when it raised), with `workflow`, `step`, `id`, `queue` and
  `attempt` in the metadata.

  ## Enqueue in your own transaction

  `enqueue_query/3` returns the statement and parameters that insert an
  instance in the application's transaction, with Ecto or Postgrex, so that
  a business write and the work it implies commit together:

      Repo.transaction(fn ->
        order = Repo.insert!(order)
        {sql, params} = GenDurable.enqueue_query(Orders.Fulfil, %{order_id: order.id})
        Repo.query!(sql, params)
      end)

  Given a module, it applies the module's declared defaults and the rate
  limit declared for its first step, as an insert through an engine does;
  the engines' configuration does not apply (see `enqueue_query/3`).
  """

  # `GenDurable.send/4` sends a signal to an instance; messages are sent
  # with `Kernel.send/2`, written in full.
  import Kernel, except: [send: 2]

  alias GenDurable.{Error, Native, Options}

  @typedoc "A concurrency or rate-limit key: a string, or `{name, id}` for `\"name:id\"`."
  @type key :: String.t() | {atom | String.t(), String.Chars.t()}

  @typedoc """
  What an insert reports for one instance: its id, or, for an insert given
  `:unique` or `:idempotency_key`, `%{id: id, conflict?: conflict}`, where
  `conflict?` says that an existing instance holds the identity (the id is
  then that instance's, and nothing was inserted).
  """
  @type inserted :: integer | %{id: integer, conflict?: boolean}

  @type step_result ::
          {:next, String.t(), map}
          | {:next, String.t(), map,
             [concurrency_key: key | nil, rate_limit: key, schedule_in: non_neg_integer]}
          | {:done, map}
          | {:await, String.t(), map,
             [signal: String.t(), timeout: non_neg_integer, until: DateTime.t()]}
          | {:snooze, non_neg_integer}
          | {:error, term}
          | {:discard, term}
          | {:cancel, term}

  @doc """
  Runs one step of an instance: `step` is the current step's name, `state`
  the instance's state (a map with string keys).
  """
  @callback handle_step(step :: String.t(), state :: map, ctx :: GenDurable.Context.t()) ::
              step_result

  @doc """
  Makes the module a workflow: declares the `GenDurable` behaviour.

  Options:

    * `:rate_limits` — a map of step names to rate-limit keys, such as
      `%{"call_api" => "openai:default"}`. See "Rate limits per step" in the
      module documentation.
    * `:queue`, `:priority`, `:max_attempts`, `:backoff` (`{base, max}` in
      milliseconds) — the workflow's defaults. See "Defaults per workflow"
      in the module documentation.
    * `:timeout` (ms) and `:step_timeouts` (`%{step => ms}`) — how long
      its steps may run. See "Step timeouts" in the module documentation.

  An unknown option or a bad `:rate_limits` or `:step_timeouts` raises
  `ArgumentError` when the module is compiled; the engine's core checks the
  defaults when it starts.
  """
  defmacro __using__(opts) do
    quote bind_quoted: [opts: opts] do
      @behaviour GenDurable
      {rate_limits, step_timeouts, defaults} = GenDurable.__use__!(__MODULE__, opts)
      @gen_durable_rate_limits rate_limits
      @gen_durable_step_timeouts step_timeouts
      @gen_durable_defaults defaults

      @doc false
      def __gen_durable_workflow__, do: GenDurable.workflow_name(__MODULE__)

      @doc false
      def __gen_durable_rate_limits__, do: @gen_durable_rate_limits

      @doc false
      def __gen_durable_step_timeouts__, do: @gen_durable_step_timeouts

      @doc false
      def __gen_durable_defaults__, do: @gen_durable_defaults
    end
  end

  @defaults [:queue, :priority, :max_attempts, :backoff, :timeout]
  @use_options [:rate_limits, :step_timeouts | @defaults]

  @doc false
  # Checks the options of `use GenDurable` when the workflow module is
  # compiled; returns the declared rate limits, the declared step timeouts
  # and the workflow's defaults (a keyword list of those given, `:timeout`
  # included). The defaults' values are the core's to check, when the
  # engine starts.
  def __use__!(module, opts) do
    what = "use GenDurable in #{inspect(module)}"

    unless is_list(opts) and Keyword.keyword?(opts) do
      raise ArgumentError, "#{what}: options must be a keyword list, got: #{inspect(opts)}"
    end

    case Keyword.keys(opts) -- @use_options do
      [] ->
        :ok

      [unknown | _] ->
        raise ArgumentError,
              "#{what}: unknown option #{inspect(unknown)}; known: " <>
                Enum.map_join(@use_options, ", ", &inspect/1)
    end

    declared = Keyword.get(opts, :rate_limits, %{})
    timeouts = Keyword.get(opts, :step_timeouts, %{})

    with :ok <- check_rate_limits(declared),
         :ok <- check_step_timeouts(timeouts) do
      {declared, timeouts, Keyword.take(opts, @defaults)}
    else
      {:error, message} -> raise ArgumentError, "#{what}: #{message}"
    end
  end

  # A `step_timeouts: %{step => ms}` declaration: a map of non-empty
  # strings to positive integers (milliseconds).
  defp check_step_timeouts(declared) when is_map(declared) and not is_struct(declared) do
    declared
    |> Enum.sort()
    |> Enum.find_value(:ok, fn {step, ms} ->
      cond do
        not non_empty_string?(step) ->
          {:error, "step_timeouts: step names must be non-empty strings, got: #{inspect(step)}"}

        not (is_integer(ms) and ms > 0) ->
          {:error,
           "step_timeouts: the timeout of step #{inspect(step)} must be a positive integer " <>
             "(milliseconds), got: #{inspect(ms)}"}

        true ->
          nil
      end
    end)
  end

  defp check_step_timeouts(other) do
    {:error,
     "step_timeouts must be a map of step names to milliseconds, such as " <>
       "%{\"capture\" => 10_000}, got: #{inspect(other)}"}
  end

  # A `rate_limits: %{step => key}` declaration: a map of non-empty strings,
  # each key naming a rate limit. Whether that rate limit is configured is
  # the engine's to say when it starts.
  defp check_rate_limits(declared) when is_map(declared) and not is_struct(declared) do
    declared
    |> Enum.sort()
    |> Enum.find_value(:ok, fn {step, key} ->
      cond do
        not non_empty_string?(step) ->
          {:error, "rate_limits: step names must be non-empty strings, got: #{inspect(step)}"}

        not non_empty_string?(key) or String.starts_with?(key, ":") ->
          {:error,
           "rate_limits: the key for step #{inspect(step)} must be a string naming a " <>
             "configured rate limit, such as \"openai:default\", got: #{inspect(key)}"}

        true ->
          nil
      end
    end)
  end

  defp check_rate_limits(other) do
    {:error,
     "rate_limits must be a map of step names to rate-limit keys, such as " <>
       "%{\"call_api\" => \"openai:default\"}, got: #{inspect(other)}"}
  end

  defp non_empty_string?(s), do: is_binary(s) and s != "" and String.valid?(s)

  @doc """
  The workflow name a module is stored under: its name without `Elixir.`.

      iex> GenDurable.workflow_name(Account.Sync)
      "Account.Sync"
  """
  @spec workflow_name(module) :: String.t()
  def workflow_name(module) when is_atom(module) do
    case Atom.to_string(module) do
      "Elixir." <> name -> name
      name -> name
    end
  end

  @doc false
  def child_spec(opts) do
    name = if is_list(opts), do: Keyword.get(opts, :name, GenDurable), else: GenDurable

    %{
      id: name,
      start: {__MODULE__, :start_link, [opts]},
      type: :supervisor
    }
  end

  @doc """
  Starts an engine and its step processes under a supervisor registered as
  the `:name` option. See the module documentation for the options.
  Returns `{:error, %GenDurable.Error{}}` for invalid options.
  """
  @spec start_link(keyword) :: Supervisor.on_start() | {:error, Error.t()}
  def start_link(opts) do
    with {:ok, v} <- Options.validate(opts),
         :ok <- check(v.config) do
      await_previous_tree(v)

      case GenDurable.Supervisor.start_link(v) do
        {:error, {:shutdown, {:failed_to_start_child, _, %Error{} = e}}} -> {:error, e}
        other -> other
      end
    end
  end

  # The core checks the options as it will when the engine starts, without
  # connecting: nothing starts with options it would refuse.
  defp check(%{options: options, workflows: workflows}) do
    case Native.engine_check(options, workflows) do
      :ok -> :ok
      {:error, e} -> {:error, Error.from_native(e)}
    end
  end

  # The processes of a tree whose supervisor was killed stop on their own
  # (the engine lets its node stop gracefully, within its shutdown timeout).
  # A new tree of the same name starts when they are gone, so that its
  # processes can take their names and one node runs at a time.
  defp await_previous_tree(v) do
    if Process.whereis(v.name) == nil do
      deadline = System.monotonic_time(:millisecond) + v.shutdown_timeout + 15_000

      for child <- [Engine, Dispatcher, Tasks] do
        case Process.whereis(Module.concat(v.name, child)) do
          nil -> :ok
          pid -> await_exit(pid, deadline)
        end
      end
    end

    :ok
  end

  defp await_exit(pid, deadline) do
    ref = Process.monitor(pid)

    receive do
      {:DOWN, ^ref, :process, _, _} -> :ok
    after
      max(deadline - System.monotonic_time(:millisecond), 0) ->
        Process.demonitor(ref, [:flush])
    end
  end

  # -- Client API ----------------------------------------------------------

  @doc """
  Inserts an instance of `workflow` (a module using `GenDurable`, or a
  workflow name as a string). Returns `{:ok, id}`, or `{:ok, %{id: id,
  conflict?: boolean}}` for a unique insert (see below). A module that does
  not use `GenDurable` is refused; a workflow only other nodes define (in
  Rust, Python or another release) is inserted by its name.

  Options:

    * `:state` — a map (default `%{}`), stored as JSON: keys become strings
    * `:step` — the first step (default `"start"`)
    * `:queue` — default: the workflow's, else `"default"`
    * `:priority` — 0 (first) to 9; default: the workflow's, else 0
    * `:concurrency_key` — `"stripe:7"` or `{:stripe, 7}`
    * `:rate_limit` — a rate-limit key for the first step
    * `:schedule_in` (ms) or `:scheduled_at` (`DateTime`, or an RFC 3339 string)
    * `:max_attempts` — attempts per step; default: the workflow's, else 20
    * `:unique` — insert nothing if an instance with the same identity
      exists: `[fields: [:account], period: ms, states: :active]`, each
      optional; `true` or `[]` for the defaults, `false` or `nil` for a
      plain insert. See "Unique inserts" below.
    * `:idempotency_key` — a string (1 to 1024 bytes): at most one instance
      with this key
    * `:engine` — the engine's name (default `GenDurable`)

  Only the options given are passed: the core fills in the rest, from the
  workflow's defaults (`use GenDurable, queue: ...`) when the engine runs
  the workflow, else the engine's. The core checks the options
  (`gendurable::options::InsertOptions`) and the values; an error names the
  option in its `:field`.

  ## Unique inserts

  An insert given `:unique` or `:idempotency_key` inserts nothing when an
  instance holding the same identity exists, and reports that instance:
  it returns `{:ok, %{id: id, conflict?: true}}` then, `{:ok, %{id: id,
  conflict?: false}}` when it inserted.

    * The identity is the idempotency key when there is one; otherwise the
      workflow, the concurrency key and the state: all of it, or the
      top-level fields named by `fields:` (atoms or strings; a missing field
      counts as `nil`).
    * `period: ms` (at least 1 000) adds the window of that length the
      database's clock is in: duplicates are refused within the same fixed
      window, aligned on the Unix epoch (not a sliding one).
    * `states:` — the statuses in which an instance holds its identity:
      `:active` (scheduled, available, executing, awaiting: until it
      finishes), `:all` (as long as it is kept) or a list that includes the
      active four. Default: the active ones and `:completed` (a cancelled or
      discarded instance lets a new one in). An idempotency key takes
      `unique: [states: ...]` too.

  The database enforces it with a unique index: two racing inserts of one
  identity, on any nodes, give one instance, and both are told its id. The
  core checks the options; a bad one is an `:invalid_input` error whose
  `:field` is `:unique`, `:"unique.fields"`, `:"unique.period"`,
  `:"unique.states"` or `:idempotency_key`. An insert may fail with kind
  `:contended` when the instances holding its identity kept finishing
  while it ran; retrying succeeds.

  ## Example

      {:ok, id} = GenDurable.insert(Account.Sync, state: %{account: 42}, concurrency_key: {:account, 42})

      {:ok, %{id: id, conflict?: false}} = GenDurable.insert(Charge, idempotency_key: "charge:42")
      {:ok, %{id: ^id, conflict?: true}} = GenDurable.insert(Charge, idempotency_key: "charge:42")
  """
  @spec insert(module | String.t(), keyword) :: {:ok, inserted} | {:error, Error.t()}
  def insert(workflow, opts \\ []) do
    with {:ok, engine} <- engine(opts),
         {:ok, new} <- new_instance(workflow, opts),
         {:ok, [inserted]} <- native(&Native.insert_many(engine, [new], &1)) do
      {:ok, inserted(opts, inserted)}
    end
  end

  @doc "Like `insert/2`, raising `GenDurable.Error`."
  @spec insert!(module | String.t(), keyword) :: inserted
  def insert!(workflow, opts \\ []), do: bang(insert(workflow, opts))

  @doc """
  Inserts many instances in one round trip: a list of `{workflow, opts}`.
  All are inserted or none. Returns `{:ok, results}` in order: an id for
  each plain insert, `%{id: id, conflict?: boolean}` for each given
  `:unique` or `:idempotency_key` (see `insert/2`). Two instances of the
  batch with the same identity: the first is inserted, the later ones
  report it (`conflict?: true`).

      GenDurable.insert_all(for i <- 1..100, do: {Account.Sync, state: %{account: i}})
  """
  @spec insert_all([{module | String.t(), keyword}], keyword) ::
          {:ok, [inserted]} | {:error, Error.t()}
  def insert_all(instances, opts \\ []) when is_list(instances) do
    with {:ok, engine} <- engine(opts),
         {:ok, news} <- new_instances(instances) do
      case news do
        [] ->
          {:ok, []}

        _ ->
          with {:ok, all} <- native(&Native.insert_many(engine, news, &1)) do
            {:ok, Enum.zip_with(instances, all, fn {_, o}, i -> inserted(o, i) end)}
          end
      end
    end
  end

  @doc "Like `insert_all/2`, raising `GenDurable.Error`."
  @spec insert_all!([{module | String.t(), keyword}], keyword) :: [inserted]
  def insert_all!(instances, opts \\ []), do: bang(insert_all(instances, opts))

  # An insert's result: its id, or with its conflict flag for a unique one.
  defp inserted(opts, {id, conflict}) do
    if unique?(opts), do: %{id: id, conflict?: conflict}, else: id
  end

  defp unique?(opts),
    do:
      Keyword.get(opts, :unique) not in [nil, false] or Keyword.get(opts, :idempotency_key) != nil

  @doc """
  Reads an instance: `{:ok, %GenDurable.Instance{}}`, or an error of kind
  `:not_found`.
  """
  @spec get(integer, keyword) :: {:ok, GenDurable.Instance.t()} | {:error, Error.t()}
  def get(id, opts \\ []) do
    with {:ok, engine} <- engine(opts),
         :ok <- id(id),
         {:ok, i} <- native(&Native.get(engine, id, &1)) do
      {:ok, GenDurable.Instance.from_native(Native.instance_term(i))}
    end
  end

  @doc "Like `get/2`, raising `GenDurable.Error`."
  def get!(id, opts \\ []), do: bang(get(id, opts))

  @doc """
  Wakes every instance awaiting the signal `name`; their next step sees
  `{:signal, name, payload}` as the context's `:wake`. Returns
  `{:ok, woken}`. A signal sent while nothing awaits it is not kept (a
  broadcast), unless it is given `:ttl`.

  Options:

    * `:ttl` — milliseconds: a signal that wakes nobody is kept that long
      and delivered to the **first** instance that awaits `name` meanwhile
      (once); it wakes at once when it awaits. `{:ok, 0}` then says it was
      kept.
    * `:engine` — the engine's name (default `GenDurable`).

  To reach one instance, whether or not it awaits yet, use `send/4`.

      {:ok, 1} = GenDurable.signal("approve:42", %{"by" => "ann"})
      {:ok, 0} = GenDurable.signal("rates-published", %{"day" => "2024-06-01"}, ttl: 3_600_000)
  """
  @spec signal(String.t(), term, keyword) :: {:ok, non_neg_integer} | {:error, Error.t()}
  def signal(name, payload \\ %{}, opts \\ []) do
    with {:ok, engine} <- engine(opts),
         {:ok, name} <- string(name, :signal),
         {:ok, ttl} <- ttl(Keyword.get(opts, :ttl)) do
      native(&Native.signal(engine, name, payload, ttl, &1))
    end
  end

  @doc "Like `signal/3`, raising `GenDurable.Error`."
  def signal!(name, payload \\ %{}, opts \\ []), do: bang(signal(name, payload, opts))

  @doc """
  Sends the signal `name` to one instance. If it is awaiting (whatever it
  awaits), it wakes now with the signal. If it has not reached its await
  yet, the signal is **kept** in its mailbox and delivered the moment it
  awaits `name`: signals are delivered in the order sent, each once, so a
  sender never has to poll for the await. The woken step sees
  `{:signal, name, payload}` as the context's `:wake`.

  Returns `{:ok, :woken}`, `{:ok, :kept}`, or `{:ok, {:finished, status}}`
  when the instance had finished (nothing is kept); an unknown id is an
  error of kind `:not_found`. Options: `:engine`.

      # The payment provider answers before the workflow got to its await:
      {:ok, :kept} = GenDurable.send(id, "payment_confirmed", %{"charge" => "ch_1"})
      # ...and the step that returns {:await, "paid", state, signal: "payment_confirmed"}
      # is woken at once, with ctx.wake == {:signal, "payment_confirmed", %{"charge" => "ch_1"}}.
  """
  @spec send(integer, String.t(), term, keyword) ::
          {:ok, :woken | :kept | {:finished, GenDurable.Instance.status()}}
          | {:error, Error.t()}
  def send(id, name, payload \\ %{}, opts \\ []) do
    with {:ok, engine} <- engine(opts),
         :ok <- id(id),
         {:ok, name} <- string(name, :signal) do
      native(&Native.send_signal(engine, id, name, payload, &1))
    end
  end

  @doc "Like `send/4`, raising `GenDurable.Error`."
  def send!(id, name, payload \\ %{}, opts \\ []), do: bang(send(id, name, payload, opts))

  @doc """
  Wakes one awaiting instance by id, whatever signal it awaits. Returns
  `{:ok, true}` if it was awaiting. Otherwise the signal is kept until the
  instance awaits `name`, as `send/4` does (which says which happened).
  """
  @spec signal_instance(integer, String.t(), term, keyword) ::
          {:ok, boolean} | {:error, Error.t()}
  def signal_instance(id, name, payload \\ %{}, opts \\ []) do
    with {:ok, engine} <- engine(opts),
         :ok <- id(id),
         {:ok, name} <- string(name, :signal) do
      native(&Native.signal_instance(engine, id, name, payload, &1))
    end
  end

  @doc """
  Cancels an instance. Returns `{:ok, :now}` if it was not executing,
  `{:ok, :at_outcome}` if it is executing, or `{:ok, {:already_finished,
  status}}`. An executing instance's node is told at once: it kills the
  step's process and records the outcome, `:cancelled` (a node that misses
  the word lets the step finish; its outcome records the cancellation all
  the same, unless it is `:done`).

  Options: `:reason` (recorded with the instance), `:engine`.
  """
  @spec cancel(integer, keyword) ::
          {:ok, :now | :at_outcome | {:already_finished, atom}} | {:error, Error.t()}
  def cancel(id, opts \\ []) do
    with {:ok, engine} <- engine(opts),
         :ok <- id(id),
         {:ok, reason} <- opt_string(Keyword.get(opts, :reason), :reason) do
      native(&Native.cancel(engine, id, reason, &1))
    end
  end

  @doc "Like `cancel/2`, raising `GenDurable.Error`."
  def cancel!(id, opts \\ []), do: bang(cancel(id, opts))

  # -- Operating -----------------------------------------------------------

  @typedoc """
  Conditions naming instances, every one given must hold (at least one):

    * `:ids` — a list of instance ids (or one id)
    * `:workflow` — a module using `GenDurable`, or a workflow name
    * `:queue` — a queue name
    * `:status` — a status (`:discarded`, or `"discarded"`) or a list of them
    * `:key` — a concurrency key, `"stripe:7"` or `{:stripe, 7}`
    * `:error` — text in the message of the last error recorded (any case)
  """
  @type condition ::
          {:ids, integer | [integer]}
          | {:workflow, module | String.t()}
          | {:queue, atom | String.t()}
          | {:status, GenDurable.Instance.status() | String.t() | [atom | String.t()]}
          | {:key, String.t() | {atom | String.t(), term}}
          | {:error, String.t()}

  @typedoc "What a bulk action did: instances named, and those it changed."
  @type acted :: %{matched: non_neg_integer, changed: non_neg_integer}

  @conditions [:ids, :workflow, :queue, :status, :key, :error]

  @doc """
  How many instances the conditions name: what `cancel_where/2`,
  `retry_where/2` and `delete_where/2` would look at (a dry run).

  Conditions (every one given must hold; at least one is needed, so an
  action on every instance is spelled out, e.g. with every status):
  `:ids`, `:workflow` (a module or a name), `:queue`, `:status` (one or a
  list), `:key` (a concurrency key) and `:error` (text in the last error).
  Options: `:engine`, in the same list or in a second one (as for the
  actions, whose `:reason` goes there too).

      {:ok, 12} = GenDurable.count(workflow: Billing.Charge, status: [:discarded, :cancelled])
  """
  @spec count([condition], keyword) :: {:ok, non_neg_integer} | {:error, Error.t()}
  def count(conditions, opts \\ []) do
    with {:ok, conditions} <- conditions(conditions, opts),
         :ok <- known_opts(conditions, @conditions ++ [:engine]),
         {:ok, engine} <- engine(conditions),
         {:ok, filter} <- filter(conditions) do
      native(&Native.count(engine, filter, &1))
    end
  end

  @doc """
  Cancels every instance the conditions name (see `count/2`), as
  `cancel/2` does one: at once if it is not executing, at its outcome if
  it is. Returns `{:ok, %{matched: n, changed: n}}`: the instances named,
  and those not finished already. Options: `:reason` (recorded with each;
  default `"cancelled"`), `:engine`.

      {:ok, %{matched: 3, changed: 2}} =
        GenDurable.cancel_where(queue: "imports", error: "timeout", reason: "supplier gone")
  """
  @spec cancel_where([condition], keyword) :: {:ok, acted} | {:error, Error.t()}
  def cancel_where(conditions, opts \\ []),
    do: act_where(:cancel, conditions, opts, "cancelled")

  @doc """
  Runs again now every scheduled, discarded or cancelled instance the
  conditions name (see `count/2`): a scheduled one keeps its attempts, a
  discarded or cancelled one gets its step's attempts afresh; not one whose
  unique identity another instance holds now. A `retry` entry is recorded in
  each one's errors. Returns `{:ok, %{matched: n, changed: n}}`. Options:
  `:reason` (default `"retried"`), `:engine`.

      {:ok, %{matched: 40, changed: 40}} =
        GenDurable.retry_where(workflow: Billing.Charge, status: :discarded, error: "gateway")
  """
  @spec retry_where([condition], keyword) :: {:ok, acted} | {:error, Error.t()}
  def retry_where(conditions, opts \\ []), do: act_where(:retry, conditions, opts, "retried")

  @doc """
  Deletes every instance the conditions name (see `count/2`) that is not
  executing or claimed by a node (cancel those first), with the signals
  kept for it. Returns `{:ok, %{matched: n, changed: n}}`, `changed` being
  those deleted. Options: `:engine`.
  """
  @spec delete_where([condition], keyword) :: {:ok, acted} | {:error, Error.t()}
  def delete_where(conditions, opts \\ []), do: act_where(:delete, conditions, opts, nil)

  @doc """
  Runs instance `id` again now (see `retry_where/2`). Returns `{:ok, true}`
  if it was made runnable, `{:ok, false}` if not (it is running, awaiting
  or completed, or another instance holds its unique identity); an unknown
  id is an error of kind `:not_found`. Options: `:engine`.
  """
  @spec retry(integer, keyword) :: {:ok, boolean} | {:error, Error.t()}
  def retry(id, opts \\ []), do: act_one(:retry, id, opts)

  @doc """
  Deletes instance `id` unless it is executing or claimed by a node.
  Returns `{:ok, true}` if it was deleted, `{:ok, false}` if not; an
  unknown id is an error of kind `:not_found`. Options: `:engine`.
  """
  @spec delete(integer, keyword) :: {:ok, boolean} | {:error, Error.t()}
  def delete(id, opts \\ []), do: act_one(:delete, id, opts)

  @doc """
  Pauses `queue` cluster-wide: no node claims from it (nor starts an
  instance inserted into it at once, nor hands a freed key to one of its
  instances) until `resume_queue/2`. Steps already running or claimed
  finish and record their outcomes (a key's next instance that a node
  started as the one before it ended is stopped instead, and runs again
  once resumed); inserts go on. The pause is stored, so
  it holds for every node and across restarts. Returns `{:ok, true}` if the
  queue was running, `{:ok, false}` if it was paused already. Options:
  `:engine`.
  """
  @spec pause_queue(atom | String.t(), keyword) :: {:ok, boolean} | {:error, Error.t()}
  def pause_queue(queue, opts \\ []), do: pause(queue, true, opts)

  @doc """
  Resumes a paused queue and wakes its pickers. Returns `{:ok, true}` if
  it was paused. Options: `:engine`.
  """
  @spec resume_queue(atom | String.t(), keyword) :: {:ok, boolean} | {:error, Error.t()}
  def resume_queue(queue, opts \\ []), do: pause(queue, false, opts)

  @doc """
  The paused queues and since when: `{:ok, [{"billing", ~U[...]}]}`.
  Options: `:engine`.
  """
  @spec paused_queues(keyword) :: {:ok, [{String.t(), DateTime.t()}]} | {:error, Error.t()}
  def paused_queues(opts \\ []) do
    with {:ok, engine} <- engine(opts),
         :ok <- known_opts(opts, [:engine]),
         {:ok, paused} <- native(&Native.paused_queues(engine, &1)) do
      {:ok, for({q, us} <- paused, do: {q, DateTime.from_unix!(us, :microsecond)})}
    end
  end

  @doc """
  The engine's metrics in the Prometheus text format, as the
  `:metrics_listen` listener serves them: this node's counters and
  histograms (label `node`) and, from the database, instances waiting or
  running per queue and status and gate slots in use. Returns `{:ok, text}`.
  Options: `:engine`.
  """
  @spec metrics(keyword) :: {:ok, String.t()} | {:error, Error.t()}
  def metrics(opts \\ []) do
    with {:ok, engine} <- engine(opts),
         :ok <- known_opts(opts, [:engine]) do
      native(&Native.metrics(engine, &1))
    end
  end

  @doc """
  Where the running engine's metrics listener listens, `{:ok, "host:port"}`
  (the port bound when `:metrics_listen` gave port 0), or `{:ok, nil}`
  without one. Options: `:engine`.
  """
  @spec metrics_addr(keyword) :: {:ok, String.t() | nil} | {:error, Error.t()}
  def metrics_addr(opts \\ []) do
    with {:ok, engine} <- engine(opts),
         :ok <- known_opts(opts, [:engine]) do
      native(&Native.metrics_addr(engine, &1))
    end
  end

  defp act_where(action, conditions, opts, default_reason) do
    allowed = if default_reason, do: [:reason, :engine], else: [:engine]

    with {:ok, conditions} <- conditions(conditions, opts),
         :ok <- known_opts(conditions, @conditions ++ allowed),
         {:ok, engine} <- engine(conditions),
         {:ok, filter} <- filter(conditions),
         {:ok, reason} <- opt_string(Keyword.get(conditions, :reason), :reason),
         {:ok, {matched, changed}} <-
           native(&Native.act_where(engine, action, filter, reason || default_reason || "", &1)) do
      {:ok, %{matched: matched, changed: changed}}
    end
  end

  defp act_one(action, id, opts) do
    with {:ok, engine} <- engine(opts),
         :ok <- known_opts(opts, [:engine]),
         :ok <- id(id) do
      native(&Native.act_one(engine, action, id, &1))
    end
  end

  defp pause(queue, paused, opts) do
    with {:ok, engine} <- engine(opts),
         :ok <- known_opts(opts, [:engine]),
         {:ok, queue} <- string(queue, :queue) do
      native(&Native.pause_queue(engine, queue, paused, &1))
    end
  end

  # Conditions and options in one list: `count(workflow: W, engine: e)` and
  # `count([workflow: W], engine: e)` alike.
  defp conditions(conditions, opts) do
    if is_list(conditions) and Keyword.keyword?(conditions) and is_list(opts) and
         Keyword.keyword?(opts) do
      {:ok, conditions ++ opts}
    else
      {:error,
       Error.input(
         :conditions,
         "the conditions and options must be keyword lists, got: " <>
           "#{inspect(conditions)} and #{inspect(opts)}"
       )}
    end
  end

  defp known_opts(opts, known) do
    if is_list(opts) and Keyword.keyword?(opts) do
      case Keyword.keys(opts) -- known do
        [] ->
          :ok

        [k | _] ->
          {:error,
           Error.input(
             :options,
             "unknown option #{inspect(k)} (known: #{Enum.map_join(known, ", ", &inspect/1)})"
           )}
      end
    else
      {:error, Error.input(:options, "the options must be a keyword list, got: #{inspect(opts)}")}
    end
  end

  # The filter as the NIF takes it: {ids, workflow, queue, statuses, key,
  # error}, nil when not given. The core refuses an empty one and checks
  # the names.
  defp filter(c) do
    with {:ok, ids} <- condition(c, :ids, &filter_ids/1),
         {:ok, workflow} <- condition(c, :workflow, &workflow/1),
         {:ok, queue} <- condition(c, :queue, &string(&1, :queue)),
         {:ok, statuses} <- condition(c, :status, &statuses/1),
         {:ok, key} <- condition(c, :key, &filter_key/1),
         {:ok, error} <- condition(c, :error, &string(&1, :error)) do
      {:ok, {ids, workflow, queue, statuses, key, error}}
    end
  end

  defp condition(c, name, fun) do
    case Keyword.fetch(c, name) do
      :error -> {:ok, nil}
      {:ok, nil} -> {:ok, nil}
      {:ok, v} -> fun.(v)
    end
  end

  defp filter_ids(id) when is_integer(id), do: {:ok, [id]}

  defp filter_ids(ids) when is_list(ids) do
    if Enum.all?(ids, &is_integer/1),
      do: {:ok, ids},
      else: {:error, Error.input(:ids, "invalid ids: must be integers, got: #{inspect(ids)}")}
  end

  defp filter_ids(other),
    do:
      {:error,
       Error.input(:ids, "invalid ids: must be a list of integers, got: #{inspect(other)}")}

  defp statuses(list) when is_list(list) do
    Enum.reduce_while(list, {:ok, []}, fn s, {:ok, acc} ->
      case string(s, :status) do
        {:ok, s} -> {:cont, {:ok, [s | acc]}}
        err -> {:halt, err}
      end
    end)
    |> case do
      {:ok, acc} -> {:ok, Enum.reverse(acc)}
      err -> err
    end
  end

  defp statuses(one), do: statuses([one])

  defp filter_key(k) do
    case key(k) do
      {:ok, k} ->
        {:ok, k}

      :error ->
        {:error,
         Error.input(
           :key,
           "invalid key: must be a string or a {name, id} tuple, got: #{inspect(k)}"
         )}
    end
  end

  @doc """
  The statement and parameters that insert an instance of `workflow` in
  your own transaction: `{sql, params}` for `Repo.query!/2` (Ecto) or
  `Postgrex.query!/3`, so that a business write and the work it implies
  commit together, or neither does. No engine is needed where it runs.

      Repo.transaction(fn ->
        order = Repo.insert!(order)

        {sql, params} =
          GenDurable.enqueue_query(Orders.Fulfil, %{order_id: order.id},
            concurrency_key: {:account, order.account_id}
          )

        %{rows: [[instance_id, false]]} = Repo.query!(sql, params)
      end)

  The statement, `SELECT id, conflict FROM "<schema>".enqueue(...)`, calls
  the SQL function `<schema>.enqueue(...)` (see "Enqueue in the
  application's own transaction" in `docs/operations.md`): the row appears,
  and the engines' pickers of its queue are woken, when the transaction
  commits; a rollback leaves nothing. It returns one row, `[id, conflict]`:
  `Repo.query!/2` gives `%{rows: [[id, false]]}` for an instance inserted.
  Given `:unique` or `:idempotency_key` (as for `insert/2`), an instance
  holding the identity makes it insert nothing and return
  `[[holder_id, true]]` (while another transaction inserts the same
  identity, the statement waits for it to commit or roll back). Identities
  are shared with `insert/2` and every other front door.

  `workflow` is a module using `GenDurable` or a workflow name; `state` a
  map (default `%{}`). Options: `:step`, `:queue`, `:priority`,
  `:concurrency_key` (`"stripe:7"` or `{:stripe, 7}`), `:rate_limit`,
  `:max_attempts`, `:schedule_in` (ms, from the transaction's start) or
  `:scheduled_at` (`DateTime`, or an RFC 3339 string), `:unique`
  (`[fields: [...], period: ms, states: ...]`, `true` or `[]`) and
  `:idempotency_key`, as for `insert/2`, and `:schema`, the engine's schema
  (default `"gendurable"`).

  Only the options given become arguments; every value is a parameter,
  never statement text: the state is passed as JSON text (cast
  `::text::jsonb`, so no JSON library is needed in Postgrex),
  `:scheduled_at` as RFC 3339 text, a unique insert as `"unique" => true`
  and its fields and statuses as `text[]` (`states: :active` and `:all`
  become their lists of statuses) and its period as milliseconds
  (`unique_period => $n::bigint * interval '1 millisecond'`). A module's declarations apply as in an
  insert through an engine: its defaults (`use GenDurable, queue: ...,
  priority: ..., max_attempts: ...`) fill the options not given, and a rate
  limit it declares for the first step applies unless `:rate_limit` is
  given. A workflow given by its name gets none of these, nor do the
  engines' `workflow_defaults` option and the check that a rate limit's
  name is configured.

  The function checks the values when the statement runs, in the
  transaction, like an insert and with its messages (SQLSTATE 22023, such
  as `invalid priority: must be 0 to 9, got 12`). What cannot become a
  parameter raises `GenDurable.Error` here, as an insert returns it: an
  unknown option, a value of the wrong type, a state that is not JSON or
  holds a NUL character, a schema that is not 1 to 48 characters of `a-z`,
  `0-9` and `_`.
  """
  @spec enqueue_query(module | String.t(), map, keyword) ::
          {String.t(), [String.t() | integer | boolean | [String.t()]]}
  def enqueue_query(workflow, state \\ %{}, opts \\ []) do
    with :ok <- insert_opts(opts),
         :ok <- enqueue_opts(opts),
         {:ok, schema} <- schema(Keyword.get(opts, :schema, "gendurable")),
         {:ok, new} <- new_instance(workflow, [state: state] ++ Keyword.delete(opts, :schema)),
         new = with_declared(new, workflow),
         {:ok, args} <- enqueue_args(new) do
      {enqueue_statement(schema, args), Enum.map(args, &elem(&1, 1))}
    else
      {:error, e} -> raise e
    end
  end

  # -- Helpers --------------------------------------------------------------

  @doc false
  # An insert as the core reads it (see new_instance/2), for the engine's
  # `:cron` entries.
  def __instance__(workflow, opts), do: new_instance(workflow, opts)

  @doc false
  # The running engine named by `opts[:engine]`, and a call to the NIF with
  # its errors as `GenDurable.Error`s: for `GenDurable.Testing`.
  def __engine__(opts), do: engine(opts)

  @doc false
  def __native__(fun), do: native(fun)

  @doc false
  # A key as stored: "name:rest", from a string or a {name, id} tuple.
  def key(k) when is_binary(k), do: {:ok, k}

  def key({name, id})
      when (is_atom(name) or is_binary(name)) and name not in [nil, true, false] do
    if String.Chars.impl_for(id) != nil and not is_nil(id) and not is_map(id) and not is_list(id),
      do: {:ok, "#{name}:#{id}"},
      else: :error
  end

  def key(_), do: :error

  defp engine(opts) do
    name = if is_list(opts), do: Keyword.get(opts, :engine, GenDurable), else: GenDurable

    case :persistent_term.get({GenDurable, name}, nil) do
      nil ->
        {:error,
         %Error{
           kind: :not_running,
           message: "no GenDurable engine named #{inspect(name)} is running"
         }}

      res ->
        {:ok, res}
    end
  end

  defp native(fun) do
    case Native.call(fun) do
      {:error, e} -> {:error, Error.from_native(e)}
      ok -> ok
    end
  end

  defp bang({:ok, v}), do: v
  defp bang({:error, e}), do: raise(e)

  defp id(id) when is_integer(id), do: :ok

  defp id(id),
    do: {:error, Error.input(:id, "invalid id: must be an integer, got: #{inspect(id)}")}

  defp new_instances(list) do
    list
    |> Enum.with_index()
    |> Enum.reduce_while({:ok, []}, fn
      {{wf, opts}, i}, {:ok, acc} ->
        case new_instance(wf, opts) do
          {:ok, new} ->
            {:cont, {:ok, [new | acc]}}

          {:error, e} ->
            {:halt,
             {:error,
              %{
                e
                | message: "#{e.message} (instance #{i} of #{length(list)}; nothing was inserted)"
              }}}
        end

      {other, i}, _ ->
        {:halt,
         {:error,
          Error.input(
            :instances,
            "invalid instance #{i}: expected {workflow, opts}, got: #{inspect(other)}"
          )}}
    end)
    |> case do
      {:ok, acc} -> {:ok, Enum.reverse(acc)}
      err -> err
    end
  end

  # An insert as the core reads it (`gendurable::options::InsertOptions`):
  # a map of the options, the workflow's name, keys as strings and times as
  # RFC 3339. The core checks every option; its messages name it.
  defp new_instance(workflow, opts) do
    with :ok <- insert_opts(opts),
         {:ok, wf} <- workflow(workflow),
         {:ok, unique} <- unique(Keyword.get(opts, :unique)) do
      new =
        opts
        |> Keyword.delete(:engine)
        |> Map.new(fn {k, v} -> {k, insert_value(k, v)} end)
        |> Map.put(:workflow, wf)

      {:ok, if(Keyword.has_key?(opts, :unique), do: %{new | unique: unique}, else: new)}
    end
  end

  # `unique:` as the core reads it (`gendurable::options::UniqueOptions`):
  # a keyword list becomes a map, `true` the defaults (`%{}`), `false` no
  # unique insert. The core checks the rest, values included.
  defp unique(true), do: {:ok, %{}}
  defp unique(false), do: {:ok, nil}

  defp unique(opts) when is_list(opts) do
    if Keyword.keyword?(opts) do
      keys = Keyword.keys(opts)

      case keys -- Enum.uniq(keys) do
        [] ->
          {:ok, Map.new(opts)}

        [dup | _] ->
          {:error, Error.input(:unique, "invalid unique: #{inspect(dup)} is given twice")}
      end
    else
      {:ok, opts}
    end
  end

  defp unique(other), do: {:ok, other}

  defp insert_opts(opts) do
    if is_list(opts) and Keyword.keyword?(opts) do
      keys = Keyword.keys(opts)

      case keys -- Enum.uniq(keys) do
        [] ->
          :ok

        [dup | _] ->
          {:error, Error.input(:options, "invalid options: #{inspect(dup)} is given twice")}
      end
    else
      {:error,
       Error.input(:options, "invalid options: expected a keyword list, got: #{inspect(opts)}")}
    end
  end

  defp insert_value(k, key) when k in [:concurrency_key, :rate_limit] do
    case key(key) do
      {:ok, s} -> s
      :error -> key
    end
  end

  defp insert_value(:scheduled_at, %DateTime{} = at), do: DateTime.to_iso8601(at)
  defp insert_value(_k, v), do: v

  # -- enqueue_query --------------------------------------------------------

  @enqueue_options [
    :step,
    :queue,
    :priority,
    :concurrency_key,
    :rate_limit,
    :max_attempts,
    :schedule_in,
    :scheduled_at,
    :unique,
    :idempotency_key,
    :schema
  ]

  defp enqueue_opts(opts) do
    case Keyword.keys(opts) -- @enqueue_options do
      [] ->
        :ok

      [unknown | _] ->
        {:error,
         Error.input(
           :options,
           "invalid options: unknown option #{inspect(unknown)} (known: " <>
             Enum.map_join(@enqueue_options, ", ", &inspect/1) <> ")"
         )}
    end
  end

  # Quoted into the statement: checked as the core checks a schema name.
  defp schema(s) do
    if is_binary(s) and Regex.match?(~r/\A[a-z_][a-z0-9_]{0,47}\z/, s),
      do: {:ok, s},
      else:
        {:error,
         Error.input(
           :schema,
           "invalid schema: must be 1 to 48 characters of a-z, 0-9 and _, " <>
             "not starting with a digit, got: #{inspect(s)}"
         )}
  end

  # A module's declared defaults and first step's rate limit, where the
  # insert gives none (as the core applies them when an engine runs the
  # workflow).
  defp with_declared(new, wf) when is_atom(wf) do
    defaults =
      if function_exported?(wf, :__gen_durable_defaults__, 0),
        do: Keyword.take(wf.__gen_durable_defaults__(), [:queue, :priority, :max_attempts]),
        else: []

    new = Enum.reduce(defaults, new, fn {k, v}, acc -> Map.update(acc, k, v, &(&1 || v)) end)

    declared =
      if function_exported?(wf, :__gen_durable_rate_limits__, 0),
        do: wf.__gen_durable_rate_limits__(),
        else: %{}

    step =
      case Map.get(new, :step) do
        nil -> "start"
        a when is_atom(a) and a not in [true, false] -> Atom.to_string(a)
        s -> s
      end

    case {Map.get(new, :rate_limit), Map.get(declared, step)} do
      {nil, key} when is_binary(key) -> Map.put(new, :rate_limit, key)
      _ -> new
    end
  end

  defp with_declared(new, _name), do: new

  defp enqueue_args(new) do
    case Native.enqueue_args(new) do
      {:ok, args} -> {:ok, args}
      {:error, e} -> {:error, Error.from_native(e)}
    end
  end

  # Argument names are the NIF's, values only ever placeholders.
  defp enqueue_statement(schema, args) do
    arguments =
      args
      |> Enum.with_index(1)
      |> Enum.map_join(", ", fn {{name, _}, i} -> enqueue_argument(name, i) end)

    ~s|SELECT id, conflict FROM "#{schema}".enqueue(#{arguments})|
  end

  defp enqueue_argument("state", i), do: "state => $#{i}::text::jsonb"
  defp enqueue_argument("priority", i), do: "priority => $#{i}::integer"
  defp enqueue_argument("max_attempts", i), do: "max_attempts => $#{i}::integer"
  defp enqueue_argument("scheduled_at", i), do: "scheduled_at => $#{i}::text::timestamptz"

  defp enqueue_argument("schedule_in", i),
    do: "scheduled_at => now() + $#{i}::bigint * interval '1 millisecond'"

  defp enqueue_argument("unique", i), do: ~s|"unique" => $#{i}::boolean|
  defp enqueue_argument("unique_fields", i), do: "unique_fields => $#{i}::text[]"
  defp enqueue_argument("unique_states", i), do: "unique_states => $#{i}::text[]"

  defp enqueue_argument("unique_period", i),
    do: "unique_period => $#{i}::bigint * interval '1 millisecond'"

  defp enqueue_argument(name, i), do: "#{name} => $#{i}"

  # A module must use GenDurable; a name is passed on as it is.
  defp workflow(wf) when is_atom(wf) and wf not in [nil, true, false] do
    cond do
      not Code.ensure_loaded?(wf) ->
        {:error,
         Error.input(
           :workflow,
           "invalid workflow: no module #{inspect(wf)} is available; a workflow that " <>
             "only other nodes define is inserted by its name, as a string"
         )}

      function_exported?(wf, :__gen_durable_workflow__, 0) ->
        {:ok, workflow_name(wf)}

      true ->
        {:error,
         Error.input(
           :workflow,
           "invalid workflow: #{inspect(wf)} is not a workflow (it does not `use GenDurable`)"
         )}
    end
  end

  defp workflow(wf), do: {:ok, wf}

  defp string(s, field) when is_binary(s) do
    if String.valid?(s),
      do: {:ok, s},
      else: {:error, Error.input(field, "invalid #{field}: not valid UTF-8")}
  end

  defp string(a, field) when is_atom(a) and a not in [nil, true, false],
    do: string(Atom.to_string(a), field)

  defp string(other, field),
    do: {:error, Error.input(field, "invalid #{field}: must be a string, got: #{inspect(other)}")}

  defp ttl(nil), do: {:ok, nil}
  # Zero is the core's to refuse, with its message.
  defp ttl(ms) when is_integer(ms) and ms >= 0, do: {:ok, ms}

  defp ttl(other),
    do:
      {:error,
       Error.input(:ttl, "invalid ttl: must be positive milliseconds, got: #{inspect(other)}")}

  defp opt_string(nil, _field), do: {:ok, nil}
  defp opt_string(s, field), do: string(s, field)
end

defmodule GenDurable.Supervisor do
  @moduledoc false
  # The step processes' owner, the dispatcher, then the engine, each
  # restarted alone: the dispatcher finds the step processes' owner by
  # name, the core finds the dispatcher through the tree's resource (each
  # dispatcher registers there) and the engine's node is stopped with the
  # Engine process that owns it. The engine stops first, while its steps can
  # still answer.

  use Supervisor

  alias GenDurable.Native

  def start_link(v), do: Supervisor.start_link(__MODULE__, v, name: v.name)

  @impl true
  def init(v) do
    tasks = Module.concat(v.name, Tasks)
    dispatcher = Module.concat(v.name, Dispatcher)
    engine = Module.concat(v.name, Engine)

    args = %{
      name: v.name,
      config: v.config,
      res: Native.engine_new(),
      tasks: tasks,
      dispatcher: dispatcher,
      engine: engine
    }

    children = [
      {GenDurable.Tasks, name: tasks},
      {GenDurable.Dispatcher, args},
      Supervisor.child_spec({GenDurable.Engine, args},
        shutdown: v.shutdown_timeout + 10_000
      )
    ]

    Supervisor.init(children, strategy: :one_for_one)
  end
end

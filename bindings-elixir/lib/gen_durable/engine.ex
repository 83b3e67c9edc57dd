defmodule GenDurable.Engine do
  @moduledoc false
  # Owns the tree's running node. Starting it validates the configuration,
  # connects, migrates and starts this node's pickers. The node is tied to
  # this process: stopping it (the supervisor's shutdown) stops picking and
  # lets running steps finish within `shutdown_timeout`; if it is killed,
  # the NIF (which monitors it) stops the node the same way, and the Engine
  # the supervisor starts next waits for that before starting a new node.

  use GenServer

  alias GenDurable.{Error, Native}

  def start_link(args), do: GenServer.start_link(__MODULE__, args, name: args.engine)

  @impl true
  def init(args) do
    Process.flag(:trap_exit, true)
    # Loads :telemetry if the application has it, so that the step runner's
    # check (`function_exported?/3`) sees it; see `GenDurable.Runner`.
    Code.ensure_loaded?(:telemetry)

    %{options: options, workflows: workflows} = args.config

    case Native.call(&Native.engine_start(args.res, options, workflows, &1)) do
      :ok ->
        :persistent_term.put({GenDurable, args.name}, args.res)
        {:ok, args}

      {:error, e} ->
        {:stop, Error.from_native(e)}
    end
  end

  @impl true
  def terminate(_reason, %{res: res, name: name}) do
    key = {GenDurable, name}
    if :persistent_term.get(key, nil) == res, do: :persistent_term.erase(key)
    Native.call(&Native.engine_stop(res, &1))
  end
end

defmodule GenDurable.Tasks do
  @moduledoc false
  # The step processes' owner: every step process (runner) links itself to
  # it when it starts, so that runners die with it (killed, or stopped with
  # the tree). It traps exits and ignores its runners' ends; the dispatcher,
  # which monitors them, reports those.

  use GenServer

  def start_link(opts), do: GenServer.start_link(__MODULE__, nil, opts)

  @impl true
  def init(nil) do
    Process.flag(:trap_exit, true)
    {:ok, nil}
  end

  @impl true
  def handle_info(_exit, st), do: {:noreply, st}
end

defmodule GenDurable.Dispatcher do
  @moduledoc false
  # Starts and watches the step processes (runners, see `GenDurable.Runner`).
  # The core queues each step in the NIF and wakes an idle runner; with none
  # idle it sends `:gen_durable_steps` here (once while one is
  # outstanding), and the dispatcher starts a runner per
  # queued step (`Native.dispatcher_wanted/1`). A runner runs steps one
  # after another while its process stays as it started (see the Runner);
  # otherwise it ends after its step, and the pool grows again on demand.
  #
  # A runner that dies is reported to the NIF with its exit reason
  # (`Native.runner_exited/3`): the step it was running is answered with an
  # error, one it had not taken yet is snoozed (it never ran).
  #
  # The dispatcher holds nothing the core cannot do without: if it dies, the
  # steps no process took yet go to the next dispatcher (which registers
  # itself in `init/1`, stops the idle runners of the one before and starts
  # its own), runners already running a step answer on their own and then
  # end, and one that dies without answering is answered by the NIF.
  #
  # `{:gen_durable_cancel, pid}` comes from the core when it stops a step it
  # was waiting for (shutdown timeout, claim lost, successor not admitted):
  # the step's process is killed, whichever dispatcher started it. A runner
  # whose step was stopped never takes another, so the kill cannot reach a
  # later step.
  #
  # Exits are trapped so that `terminate/2` runs when the tree stops: the
  # runners are killed (the steps still running answered with an error),
  # and the steps no process took are snoozed.

  use GenServer

  alias GenDurable.Native

  def start_link(args), do: GenServer.start_link(__MODULE__, args, name: args.dispatcher)

  @impl true
  def init(args) do
    Process.flag(:trap_exit, true)
    # The runners of the dispatchers before this one: the idle ones stop
    # now, the others after their step; their exits are reported from here.
    {idle, busy} = Native.dispatcher_register(args.res)
    Enum.each(idle, &send(&1, :gen_durable_stop))
    # runners: monitor ref => pid
    runners = Map.new(idle ++ busy, &{Process.monitor(&1), &1})
    send(self(), :gen_durable_steps)
    {:ok, %{res: args.res, tasks: args.tasks, runners: runners}}
  end

  @impl true
  def handle_info(:gen_durable_steps, st) do
    case {Native.dispatcher_wanted(st.res), Process.whereis(st.tasks)} do
      {0, _} ->
        {:noreply, st}

      {_, nil} ->
        # The step processes' owner is restarting: the steps go back.
        Enum.each(Native.dispatcher_take(st.res), &Native.step_exited(&1, nil, ""))
        {:noreply, st}

      {n, tasks} ->
        {:noreply, %{st | runners: start(n, {st.res, tasks, self()}, st.runners)}}
    end
  end

  def handle_info({:gen_durable_cancel, pid}, st) when is_pid(pid) do
    Process.exit(pid, :kill)
    {:noreply, st}
  end

  def handle_info({:DOWN, ref, :process, pid, reason}, st) do
    case Map.pop(st.runners, ref) do
      {^pid, runners} ->
        # Does nothing if its step was answered.
        Native.runner_exited(st.res, pid, exit_message(reason))
        # A runner that died before taking a step leaves it queued: start
        # another if any is.
        send(self(), :gen_durable_steps)
        {:noreply, %{st | runners: runners}}

      {nil, _} ->
        {:noreply, st}
    end
  end

  def handle_info(_other, st), do: {:noreply, st}

  @impl true
  def terminate(_reason, st) do
    Native.dispatcher_close(st.res)

    for {ref, pid} <- st.runners do
      Process.demonitor(ref, [:flush])
      Process.exit(pid, :kill)
      Native.runner_exited(st.res, pid, "the engine's dispatcher stopped")
    end

    Enum.each(Native.dispatcher_take(st.res), &Native.step_exited(&1, nil, ""))
    release_queued()
  end

  # The monitor is set before the process runs, so even a process killed at
  # once is seen with its real exit reason.
  defp start(0, _args, runners), do: runners

  defp start(n, args, runners) do
    {pid, ref} = :erlang.spawn_opt(GenDurable.Runner, :start, [args], [:monitor])
    start(n - 1, args, Map.put(runners, ref, pid))
  end

  # The message is read only when the runner had not answered its step: a
  # normal exit is not formatted.
  defp exit_message(:normal), do: "the step's process exited: normal"
  defp exit_message(reason), do: "the step's process exited: #{Exception.format_exit(reason)}"

  defp release_queued do
    receive do
      :gen_durable_steps -> release_queued()
    after
      0 -> :ok
    end
  end
end

defmodule GenDurable.Runner do
  @moduledoc false
  # Takes one step and answers the core. Whatever the callback does
  # (returns, raises, throws, exits), exactly one answer is sent. A step
  # another process took (it was sent twice) or the core stopped is skipped.
  #
  # A step that returns or raises an error, or discards, is logged (a
  # warning). When the application has `:telemetry`, each step emits
  # `[:gen_durable, :step, :start]`, then `[:gen_durable, :step, :stop]` or
  # `[:gen_durable, :step, :exception]`. The package does not depend on
  # `:telemetry`: it is called through `apply/3` when its module is loaded
  # (the Engine process loads it when it starts, if it is there).

  require Logger

  alias GenDurable.Native

  # A runner: takes steps from the NIF (`Native.runner_next/2`) or, idle,
  # waits for one, and runs them one after another in this process as long
  # as it stays as it started (see `clean?/1`): a step that leaves anything
  # behind (process dictionary, links, monitors, messages, trapped exits, a
  # priority, a group leader, a registered name, a large heap) or whose
  # answer came after the core stopped it ends the runner, so that the next
  # step starts in a fresh process.
  @idle_gc 1_000
  @max_heap 65_536

  def start({res, tasks, manager}) do
    # Dies with the step processes' owner; if that is gone already, this
    # exits with :noproc before taking a step.
    Process.link(tasks)
    loop(%{res: res, tasks: tasks, manager: manager, gl: Process.group_leader()})
  end

  defp loop(r) do
    case Native.runner_next(r.res, r.manager) do
      :wait -> await(r)
      :stop -> :ok
      handle -> step(handle, r)
    end
  end

  @doc false
  def await(r) do
    receive do
      :gen_durable_step -> loop(r)
      :gen_durable_stop -> :ok
    after
      # Idle for a while: the heap (and the binaries it holds) is freed.
      @idle_gc -> :erlang.hibernate(__MODULE__, :await, [r])
    end
  end

  defp step(handle, r) do
    if run(handle) != :already_replied and clean?(r), do: loop(r)
  end

  # Not :monitored_by: on OTP 25 reading it where a NIF resource monitors
  # the process can crash the VM.
  @checks [
    :links,
    :monitors,
    :dictionary,
    :trap_exit,
    :priority,
    :group_leader,
    :registered_name,
    :message_queue_len,
    :total_heap_size
  ]

  defp clean?(%{tasks: tasks, gl: gl}) do
    case Process.info(self(), @checks) do
      [
        links: [^tasks],
        monitors: [],
        dictionary: [],
        trap_exit: false,
        priority: :normal,
        group_leader: ^gl,
        registered_name: [],
        message_queue_len: 0,
        total_heap_size: heap
      ] ->
        heap <= @max_heap

      _ ->
        false
    end
  end

  # Runs one step; returns what its answer got from the NIF (`:ok`,
  # `{:error, _}`, `:already_replied`), or `:skip`.
  def run(handle) do
    case begin(handle) do
      {:ok, module, step, state, ctx} ->
        meta = %{
          workflow: ctx.workflow,
          step: step,
          id: ctx.id,
          queue: ctx.queue,
          attempt: ctx.attempt,
          max_attempts: ctx.max_attempts,
          module: module
        }

        start = System.monotonic_time()
        telemetry(:start, %{system_time: System.system_time(), monotonic_time: start}, meta)
        {result, raised} = call(module, step, state, ctx)
        duration = System.monotonic_time() - start
        report(result, raised, duration, meta)
        reply(handle, result)

      :skip ->
        :skip
    end
  end

  defp report(result, nil, duration, meta) do
    log(result, meta)
    telemetry(:stop, %{duration: duration}, Map.put(meta, :result, outcome(result)))
  end

  defp report(result, {kind, reason, stacktrace}, duration, meta) do
    log(result, meta)

    telemetry(
      :exception,
      %{duration: duration},
      Map.merge(meta, %{kind: kind, reason: reason, stacktrace: stacktrace})
    )
  end

  defp outcome(result), do: elem(result, 0)

  defp log({:error, message, _}, meta) do
    Logger.warning(
      "gen_durable: #{where(meta)} failed (attempt #{meta.attempt} of " <>
        "#{meta.max_attempts}): #{message}",
      log_meta(meta)
    )
  end

  defp log({:discard, reason}, meta) do
    Logger.warning(
      "gen_durable: #{where(meta)} discarded the instance: #{reason}",
      log_meta(meta)
    )
  end

  defp log(_result, _meta), do: :ok

  defp where(meta),
    do: "#{meta.workflow} step #{inspect(meta.step)} of instance #{meta.id}"

  defp log_meta(meta) do
    [
      gen_durable_workflow: meta.workflow,
      gen_durable_step: meta.step,
      gen_durable_id: meta.id,
      gen_durable_attempt: meta.attempt
    ]
  end

  defp telemetry(event, measurements, meta) do
    if function_exported?(:telemetry, :execute, 3) do
      apply(:telemetry, :execute, [[:gen_durable, :step, event], measurements, meta])
    end

    :ok
  rescue
    # A handler's failure is :telemetry's to report (it detaches it); the
    # step's answer goes on.
    _ -> :ok
  end

  # Small values are converted on this process's scheduler; the NIF says
  # :dirty for larger ones, converted on a dirty scheduler.
  defp begin(handle) do
    with :dirty <- Native.step_begin(handle), do: Native.step_begin_dirty(handle)
  end

  defp reply(handle, result) do
    with :dirty <- Native.step_reply(handle, result),
         do: Native.step_reply_dirty(handle, result)
  end

  # {result for the core, nil | {kind, reason, stacktrace} if it raised}
  defp call(module, step, state, ctx) do
    {normalize(module.handle_step(step, state, ctx)), nil}
  rescue
    e ->
      {{:error, Exception.message(e), Exception.format(:error, e, __STACKTRACE__)},
       {:error, e, __STACKTRACE__}}
  catch
    kind, reason ->
      {{:error, Exception.format_banner(kind, reason, __STACKTRACE__),
        Exception.format(kind, reason, __STACKTRACE__)}, {kind, reason, __STACKTRACE__}}
  end

  @doc false
  def normalize({:next, step, state}), do: normalize({:next, step, state, []})

  def normalize({:next, step, state, opts} = r) when is_list(opts) do
    with {:ok, step} <- name(step, r),
         {:ok, state} <- state(state, r),
         :ok <- known_opts(opts, [:concurrency_key, :rate_limit, :schedule_in], r),
         {:ok, key} <- key_change(opts, r),
         {:ok, rate} <- opt_key(Keyword.get(opts, :rate_limit), :rate_limit, r),
         {:ok, delay} <- ms(Keyword.get(opts, :schedule_in), :schedule_in, r) do
      {:next, step, state, key, rate, delay}
    end
  end

  def normalize({:done, state} = r) do
    with {:ok, state} <- state(state, r), do: {:done, state}
  end

  def normalize({:await, step, state, opts} = r) when is_list(opts) do
    with {:ok, step} <- name(step, r),
         {:ok, state} <- state(state, r),
         :ok <- known_opts(opts, [:signal, :timeout, :until], r),
         {:ok, signal} <- opt_key(Keyword.get(opts, :signal), :signal, r),
         {:ok, timeout} <- ms(Keyword.get(opts, :timeout), :timeout, r),
         {:ok, until} <- until(Keyword.get(opts, :until), r) do
      if signal == nil and timeout == nil and until == nil do
        invalid(r, "an await needs at least one of :signal, :timeout and :until")
      else
        {:await, step, state, signal, timeout, until}
      end
    end
  end

  def normalize({:snooze, ms} = r) do
    if is_integer(ms) and ms >= 0,
      do: {:snooze, ms},
      else: invalid(r, "snooze takes non-negative milliseconds")
  end

  def normalize({:error, reason}), do: {:error, text(reason), nil}
  def normalize({:discard, reason}), do: {:discard, text(reason)}
  def normalize({:cancel, reason}), do: {:cancel, text(reason)}
  def normalize(other), do: invalid(other, "not a step result")

  defp invalid(r, why) do
    {:error, "handle_step returned an invalid value (#{why}): #{inspect(r, limit: 20)}", nil}
  end

  defp text(s) when is_binary(s), do: s
  defp text(a) when is_atom(a), do: Atom.to_string(a)
  defp text(e) when is_exception(e), do: Exception.message(e)
  defp text(other), do: inspect(other)

  defp name(s, _r) when is_binary(s), do: {:ok, s}
  defp name(a, _r) when is_atom(a) and a not in [nil, true, false], do: {:ok, Atom.to_string(a)}
  defp name(_, r), do: invalid(r, "the step name must be a string or an atom")

  defp state(s, _r) when is_map(s) and not is_struct(s), do: {:ok, s}
  defp state(_, r), do: invalid(r, "the state must be a map")

  defp known_opts(opts, known, r) do
    if Keyword.keyword?(opts) do
      case Keyword.keys(opts) -- known do
        [] -> :ok
        [k | _] -> invalid(r, "unknown option #{inspect(k)}")
      end
    else
      invalid(r, "options must be a keyword list")
    end
  end

  defp key_change(opts, r) do
    case Keyword.fetch(opts, :concurrency_key) do
      :error ->
        {:ok, :keep}

      {:ok, nil} ->
        {:ok, :release}

      {:ok, key} ->
        case GenDurable.key(key) do
          {:ok, k} -> {:ok, {:set, k}}
          :error -> invalid(r, "a concurrency key is a string or a {name, id} tuple")
        end
    end
  end

  defp opt_key(nil, _what, _r), do: {:ok, nil}

  defp opt_key(v, what, r) do
    case GenDurable.key(v) do
      {:ok, k} -> {:ok, k}
      :error -> invalid(r, "#{inspect(what)} must be a string")
    end
  end

  defp ms(nil, _what, _r), do: {:ok, nil}
  defp ms(n, _what, _r) when is_integer(n) and n >= 0, do: {:ok, n}
  defp ms(_, what, r), do: invalid(r, "#{inspect(what)} must be non-negative milliseconds")

  defp until(nil, _r), do: {:ok, nil}
  defp until(%DateTime{} = t, _r), do: {:ok, DateTime.to_unix(t, :microsecond)}
  defp until(_, r), do: invalid(r, ":until must be a DateTime")
end

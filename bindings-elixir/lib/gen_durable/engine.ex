defmodule GenDurable.Engine do
  @moduledoc false
  # Holds the core's engine. Starting it validates the configuration,
  # connects, migrates and starts this node's pickers; stopping it (the
  # supervisor's shutdown) stops picking and lets running steps finish
  # within `shutdown_timeout`.

  use GenServer

  alias GenDurable.{Error, Native}

  def start_link(args), do: GenServer.start_link(__MODULE__, args, name: args.engine)

  @impl true
  def init(args) do
    Process.flag(:trap_exit, true)
    dispatcher = Process.whereis(args.dispatcher)

    case Native.call(&Native.engine_start(args.config, dispatcher, true, &1)) do
      {:ok, res} ->
        :persistent_term.put({GenDurable, args.name}, res)
        {:ok, %{res: res, name: args.name}}

      {:error, e} ->
        {:stop, Error.from_native(e)}
    end
  end

  @impl true
  def terminate(_reason, %{res: res, name: name}) do
    :persistent_term.erase({GenDurable, name})
    Native.call(&Native.engine_shutdown(res, &1))
  end
end

defmodule GenDurable.Dispatcher do
  @moduledoc false
  # Receives `{:gen_durable_step, handle, module, step, state, ctx}` from the
  # core and runs each step in a process of the engine's Task.Supervisor. A
  # step process that dies before replying (killed from outside, linked
  # crash) is answered here with an error outcome.
  #
  # `{:gen_durable_cancel, handle}` comes from the core when it stops a step
  # it was waiting for (shutdown timeout, claim lost, successor not
  # admitted): the step's process is killed and not answered, as nothing
  # waits for the answer any more. A cancel for a finished step does nothing.
  #
  # Exits are trapped so that cancels sent while the engine stopped are
  # handled before the supervisor's shutdown. A dispatcher that stops answers
  # the steps it still has (queued or running) with an error and kills their
  # processes: nothing could cancel them afterwards.

  use GenServer

  alias GenDurable.Native

  def start_link(args), do: GenServer.start_link(__MODULE__, args, name: args.dispatcher)

  @impl true
  def init(args) do
    Process.flag(:trap_exit, true)
    # running: monitor ref => handle; handles: handle => {ref, pid}.
    {:ok, %{tasks: args.tasks, running: %{}, handles: %{}}}
  end

  @impl true
  def handle_info({:gen_durable_step, handle, module, step, state, ctx}, st) do
    # async_nolink monitors the task before it runs, so even a task killed
    # at once is seen with its real exit reason.
    %Task{ref: ref, pid: pid} =
      Task.Supervisor.async_nolink(st.tasks, GenDurable.Runner, :run, [
        handle,
        module,
        step,
        state,
        ctx
      ])

    {:noreply,
     %{
       st
       | running: Map.put(st.running, ref, handle),
         handles: Map.put(st.handles, handle, {ref, pid})
     }}
  end

  def handle_info({:gen_durable_cancel, handle}, st) do
    case Map.pop(st.handles, handle) do
      {nil, _} ->
        {:noreply, st}

      {{ref, pid}, handles} ->
        Process.demonitor(ref, [:flush])
        Process.exit(pid, :kill)
        {:noreply, %{st | running: Map.delete(st.running, ref), handles: handles}}
    end
  end

  # The task replied to the core itself; this is its return value.
  def handle_info({ref, _result}, st) when is_reference(ref) and is_map_key(st.running, ref) do
    Process.demonitor(ref, [:flush])
    {:noreply, forget(st, ref)}
  end

  def handle_info({:DOWN, ref, :process, _pid, reason}, st) do
    case Map.fetch(st.running, ref) do
      {:ok, handle} ->
        # A no-op when the step already replied.
        Native.step_reply(
          handle,
          {:error, "the step's process exited: #{Exception.format_exit(reason)}", nil}
        )

        {:noreply, forget(st, ref)}

      :error ->
        {:noreply, st}
    end
  end

  def handle_info(_other, st), do: {:noreply, st}

  @impl true
  def terminate(_reason, st) do
    for {ref, handle} <- st.running do
      Process.demonitor(ref, [:flush])
      {_ref, pid} = Map.fetch!(st.handles, handle)
      Process.exit(pid, :kill)
      Native.step_reply(handle, {:error, "the engine's dispatcher stopped", nil})
    end

    answer_queued()
  end

  defp answer_queued do
    receive do
      {:gen_durable_step, handle, _module, _step, _state, _ctx} ->
        Native.step_reply(handle, {:error, "the engine's dispatcher stopped", nil})
        answer_queued()
    after
      0 -> :ok
    end
  end

  defp forget(st, ref) do
    {handle, running} = Map.pop(st.running, ref)
    %{st | running: running, handles: Map.delete(st.handles, handle)}
  end
end

defmodule GenDurable.Runner do
  @moduledoc false
  # Runs one step and answers the core. Whatever the callback does (returns,
  # raises, throws, exits), exactly one answer is sent.

  alias GenDurable.Native

  def run(handle, module, step, state, ctx) do
    result =
      try do
        normalize(module.handle_step(step, state, ctx))
      rescue
        e ->
          {:error, Exception.message(e), Exception.format(:error, e, __STACKTRACE__)}
      catch
        kind, reason ->
          {:error, Exception.format_banner(kind, reason, __STACKTRACE__),
           Exception.format(kind, reason, __STACKTRACE__)}
      end

    Native.step_reply(handle, result)
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

defmodule GenDurable.TestHelper do
  @moduledoc false
  import ExUnit.Callbacks, only: [start_supervised!: 1, start_supervised: 1]

  def url, do: Application.fetch_env!(:gen_durable, :test_url)

  def unique, do: System.unique_integer([:positive])

  @doc "Starts an engine on a fresh schema; returns its name."
  def start_engine(opts) do
    opts = engine_opts(opts)
    start_supervised!({GenDurable, opts})
    opts[:name]
  end

  @doc "Options of a test engine on a fresh schema."
  def engine_opts(opts) do
    n = unique()
    name = :"gd_engine_#{n}"

    defaults = [
      name: name,
      url: url(),
      schema: "ex_t#{n}",
      queues: [default: 10],
      poll_interval: 100,
      heartbeat_interval: 500,
      lease: 5_000,
      backoff: [base: 10, max: 50],
      shutdown_timeout: 5_000,
      pool_size: 8
    ]

    Keyword.merge(defaults, opts)
  end

  def start_engine_result(opts) do
    start_supervised({GenDurable, [url: url()] ++ opts})
  end

  @doc "Registers the test process; steps reach it through the state's \"test\"."
  def register do
    name = :"gd_test_#{unique()}"
    Process.register(self(), name)
    Atom.to_string(name)
  end

  @doc "Sent by steps: {:gd, id, step, ctx, step_pid}."
  def notify(%{"test" => test}, step, ctx) do
    case Process.whereis(String.to_existing_atom(test)) do
      nil -> :ok
      pid -> send(pid, {:gd, ctx.id, step, ctx, self()})
    end
  end

  def notify(_, _, _), do: :ok

  @doc """
  Called by a step: a process of its own monitors the step's process and
  tells the test how it ended, `{:step_down, id, step, attempt, reason}`.
  Returns once the monitor is set, so that however soon the step is
  killed, the test hears the reason.
  """
  def watch(%{"test" => test}, step, ctx) do
    case Process.whereis(String.to_existing_atom(test)) do
      nil ->
        :ok

      to ->
        me = self()

        watcher =
          spawn(fn ->
            ref = Process.monitor(me)
            send(me, {:watching, self()})

            receive do
              {:DOWN, ^ref, :process, _, reason} ->
                send(to, {:step_down, ctx.id, step, ctx.attempt, reason})
            end
          end)

        receive do
          {:watching, ^watcher} -> :ok
        end
    end
  end

  def watch(_, _, _), do: :ok

  @doc "Runs a query with psql; returns its rows, fields separated by |."
  def sql(query) do
    {out, status} =
      System.cmd("psql", [url(), "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", query],
        stderr_to_stdout: true
      )

    if status != 0, do: raise("psql failed: #{out}")
    String.split(out, "\n", trim: true)
  end

  @doc """
  Runs a statement with parameters, as a driver would, in a transaction
  that ends with `finish` ("COMMIT" or "ROLLBACK"): `PREPARE` then
  `EXECUTE` with the parameters as literals (quoted here, for the test
  only). Returns `{:ok, rows}` or `{:error, output}` (with the SQLSTATE).
  """
  def sql_params(statement, params, finish \\ "COMMIT") do
    literals = Enum.map_join(params, ", ", &literal/1)

    {out, status} =
      System.cmd(
        "psql",
        [url(), "-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1", "-v", "VERBOSITY=verbose"] ++
          ["-c", "BEGIN", "-c", "PREPARE q AS " <> statement] ++
          ["-c", "EXECUTE q(#{literals})", "-c", finish],
        stderr_to_stdout: true
      )

    rows = String.split(out, "\n", trim: true)
    if status == 0, do: {:ok, rows}, else: {:error, out}
  end

  defp literal(n) when is_integer(n), do: Integer.to_string(n)
  defp literal(b) when is_boolean(b), do: Atom.to_string(b)
  defp literal(s) when is_binary(s), do: "'" <> String.replace(s, "'", "''") <> "'"

  defp literal(l) when is_list(l),
    do: "ARRAY[" <> Enum.map_join(l, ", ", &literal/1) <> "]::text[]"

  @doc "Waits for a condition that has no event (e.g. an outcome written)."
  def eventually(fun, timeout \\ 30_000) do
    deadline = System.monotonic_time(:millisecond) + timeout
    loop(fun, deadline)
  end

  defp loop(fun, deadline) do
    case fun.() do
      result when result not in [nil, false] ->
        result

      _ ->
        if System.monotonic_time(:millisecond) > deadline do
          raise ExUnit.AssertionError, message: "condition not reached in time"
        end

        Process.sleep(20)
        loop(fun, deadline)
    end
  end

  @doc "Waits until the instance has `status`; returns it."
  def wait_status(engine, id, status) do
    eventually(fn ->
      {:ok, i} = GenDurable.get(id, engine: engine)
      i.status == status and i
    end)
  end
end

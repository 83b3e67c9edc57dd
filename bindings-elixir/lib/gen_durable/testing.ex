defmodule GenDurable.Testing do
  @moduledoc """
  Helpers for the tests of an application that uses `GenDurable`, in the
  spirit of `Oban.Testing`: run a queue's instances to their end in the
  test (`drain_queue/2`), find what was inserted (`inserted/2`) and assert
  on it (`assert_inserted/2`, `refute_inserted/2`). They run against a
  real PostgreSQL: your test database, or a throwaway one
  (`GenDurable.TempPostgres`).

  ## Setting up

  Start an engine in the test, or in your application's test
  configuration, **without queues**: nothing picks the instances then, and
  the test decides when they run.

      # test/test_helper.exs
      {:ok, url, _pg} = GenDurable.TempPostgres.url_or_start()
      Application.put_env(:my_app, :gendurable_url, url)
      ExUnit.start()

      # test/billing_test.exs
      defmodule MyApp.BillingTest do
        use ExUnit.Case
        use GenDurable.Testing

        setup do
          start_supervised!(
            {GenDurable,
             url: Application.fetch_env!(:my_app, :gendurable_url),
             schema: "billing_test",
             workflows: [MyApp.Charge, MyApp.Receipt]}
          )

          :ok
        end

        test "a charge sends its receipt" do
          {:ok, _id} = MyApp.Billing.charge(account: 7, cents: 500)
          assert_inserted(MyApp.Charge, state: %{account: 7})

          assert %{completed: 2} = drain_queue(:default)
          assert_inserted(MyApp.Receipt, state: %{account: 7}, status: :completed)
          refute_inserted(MyApp.Charge, status: :discarded)
        end
      end

  `use GenDurable.Testing` imports the helpers; `use GenDurable.Testing,
  engine: MyApp.Durable` makes every helper use that engine unless given
  another (as `engine:`). Every helper takes `:engine` (default
  `GenDurable`). Tests that share a schema share its instances: give each
  test module its own `:schema`, or run them `async: false`.

  ## Inline mode

  With the engine option `inline: true`, every insert runs the queues it
  inserted into to the end before it returns (a `drain_queue/2` after each
  insert), so a test can insert and look at the result at once:

      start_supervised!({GenDurable, url: url, inline: true, workflows: [MyApp.Charge]})

      {:ok, id} = GenDurable.insert(MyApp.Charge, state: %{account: 7, cents: 500})
      {:ok, %GenDurable.Instance{status: :completed}} = GenDurable.get(id)

  Instances that await stay awaiting (signal them and drain); a retry
  waits for its backoff (drain with `with_scheduled: true` to run it).
  Steps inserting instances run those too, inside their insert.

  ## How it works

  `drain_queue/2` is the core's `Engine::drain_with`: it claims the
  queue's rows as a node of its own, one at a time in priority, schedule
  and id order, and runs each step in an Elixir process as a node does, so
  concurrency keys, gates, rate limits and step timeouts apply. An engine
  whose node serves the queue competes for the rows: hence no `:queues`.
  `inserted/2` is `Engine::inserted`: the instances of a workflow whose
  state contains the fields given (JSON containment), oldest first.
  """

  alias GenDurable.{Error, Instance, Native}

  @typedoc "What `drain_queue/2` ran: steps, and how they ended."
  @type drained :: %{
          steps: non_neg_integer,
          completed: non_neg_integer,
          discarded: non_neg_integer,
          cancelled: non_neg_integer,
          retried: non_neg_integer,
          snoozed: non_neg_integer,
          awaiting: non_neg_integer
        }

  # As the NIF reports them, in order.
  @counts [:steps, :completed, :discarded, :cancelled, :retried, :snoozed, :awaiting]

  @statuses [:scheduled, :available, :executing, :awaiting, :completed, :cancelled, :discarded]

  @doc """
  Imports the helpers. With `engine: name`, they use that engine unless a
  call names another.
  """
  defmacro __using__(opts) do
    quote bind_quoted: [opts: opts] do
      @gen_durable_testing Keyword.take(opts, [:engine])

      @doc false
      def drain_queue(queue, opts \\ []),
        do: GenDurable.Testing.drain_queue(queue, Keyword.merge(@gen_durable_testing, opts))

      @doc false
      def inserted(workflow, opts \\ []),
        do: GenDurable.Testing.inserted(workflow, Keyword.merge(@gen_durable_testing, opts))

      @doc false
      def assert_inserted(workflow, opts \\ []),
        do:
          GenDurable.Testing.assert_inserted(workflow, Keyword.merge(@gen_durable_testing, opts))

      @doc false
      def refute_inserted(workflow, opts \\ []),
        do:
          GenDurable.Testing.refute_inserted(workflow, Keyword.merge(@gen_durable_testing, opts))
    end
  end

  @doc """
  Runs every runnable instance of `queue` (an atom or a string) to its end,
  one step at a time, each step's next step included, and returns what ran:

      %{steps: 4, completed: 2, discarded: 0, cancelled: 0, retried: 1, snoozed: 1, awaiting: 0}

  `retried` counts errors with attempts left (scheduled for a retry),
  `discarded` discards and errors on the last attempt, `awaiting` steps
  that ended in an await (the instance stays awaiting).

  Options:

    * `:with_scheduled` — also run the queue's scheduled instances at once
      (delays, retries waiting out their backoff, snoozes), again after
      every step: errors are retried to their last attempt within the drain.
      Default `false`.
    * `:max_steps` — stop after this many steps (default 10 000): a
      workflow that never ends stops the drain there.
    * `:engine` — the engine's name (default `GenDurable`).

  Raises `GenDurable.Error` if the engine refuses (no engine of that name,
  a bad queue name, the database).
  """
  @spec drain_queue(atom | String.t(), keyword) :: drained
  def drain_queue(queue, opts \\ []) do
    with :ok <- known(opts, [:engine, :with_scheduled, :max_steps]),
         {:ok, engine} <- GenDurable.__engine__(opts),
         {:ok, queue} <- name(queue, :queue),
         {:ok, scheduled} <- boolean(Keyword.get(opts, :with_scheduled, false), :with_scheduled),
         {:ok, max} <- count(Keyword.get(opts, :max_steps), :max_steps),
         {:ok, counts} <-
           GenDurable.__native__(&Native.drain(engine, queue, scheduled, max, &1)) do
      @counts |> Enum.zip(Tuple.to_list(counts)) |> Map.new()
    else
      {:error, e} -> raise e
    end
  end

  @doc """
  The instances of `workflow` (a module using `GenDurable`, or a workflow
  name) matching the options, oldest first.

  Options:

    * `:state` — a map: instances whose state contains these fields with
      these values (JSON containment: `%{account: 7}` matches `%{"account"
      => 7, "cents" => 500}`; nested maps match the same way).
    * `:queue`, `:status` (`:scheduled`, `:available`, `:executing`,
      `:awaiting`, `:completed`, `:cancelled` or `:discarded`).
    * `:limit` — at most this many (default 1 000).
    * `:engine` — the engine's name (default `GenDurable`).

  Raises `GenDurable.Error` on a bad option.
  """
  @spec inserted(module | String.t(), keyword) :: [Instance.t()]
  def inserted(workflow, opts \\ []) do
    case find(workflow, opts) do
      {:ok, found} -> found
      {:error, e} -> raise e
    end
  end

  @doc """
  Asserts that at least one instance of `workflow` matches the options (as
  for `inserted/2`): returns those found, or raises
  `ExUnit.AssertionError` listing the workflow's instances.

      assert_inserted(MyApp.Charge, state: %{account: 7}, queue: "billing")
      [%GenDurable.Instance{id: id}] = assert_inserted(MyApp.Receipt, status: :completed)
  """
  @spec assert_inserted(module | String.t(), keyword) :: [Instance.t()]
  def assert_inserted(workflow, opts \\ []) do
    case inserted(workflow, opts) do
      [] ->
        flunk(
          "Expected an instance of #{describe(workflow, opts)}, found none.\n" <>
            found(workflow, opts)
        )

      found ->
        found
    end
  end

  @doc """
  Asserts that no instance of `workflow` matches the options (as for
  `inserted/2`): returns `:ok`, or raises `ExUnit.AssertionError` listing
  the instances that match.

      refute_inserted(MyApp.Charge, state: %{account: 8})
  """
  @spec refute_inserted(module | String.t(), keyword) :: :ok
  def refute_inserted(workflow, opts \\ []) do
    case inserted(workflow, opts) do
      [] ->
        :ok

      found ->
        flunk(
          "Expected no instance of #{describe(workflow, opts)}, found #{length(found)}:\n" <>
            list(found)
        )
    end
  end

  # -- Helpers ----------------------------------------------------------------

  defp find(workflow, opts) do
    with :ok <- known(opts, [:engine, :state, :queue, :status, :limit]),
         {:ok, engine} <- GenDurable.__engine__(opts),
         {:ok, wf} <- workflow(workflow),
         {:ok, state} <- state(Keyword.get(opts, :state)),
         {:ok, queue} <- opt_name(Keyword.get(opts, :queue), :queue),
         {:ok, status} <- status(Keyword.get(opts, :status)),
         {:ok, limit} <- count(Keyword.get(opts, :limit), :limit),
         {:ok, res} <-
           GenDurable.__native__(&Native.inserted(engine, wf, state, queue, status, limit, &1)) do
      {:ok, Enum.map(Native.instances_term(res), &Instance.from_native/1)}
    end
  end

  # The test's own message; ExUnit is loaded where assertions run.
  defp flunk(message), do: raise(ExUnit.AssertionError, message: message)

  defp describe(workflow, opts) do
    filters =
      opts
      |> Keyword.take([:state, :queue, :status])
      |> Enum.map_join(", ", fn {k, v} -> "#{k}: #{inspect(v)}" end)

    name = inspect(workflow_name(workflow))
    if filters == "", do: name, else: "#{name} with #{filters}"
  end

  # What there is of the workflow, whatever the filters, to see why none
  # matched.
  defp found(workflow, opts) do
    case find(workflow, Keyword.take(opts, [:engine]) ++ [limit: 20]) do
      {:ok, []} ->
        "There are no instances of #{inspect(workflow_name(workflow))}."

      {:ok, all} ->
        "Instances of #{inspect(workflow_name(workflow))} (oldest first, at most 20):\n" <>
          list(all)

      {:error, _} ->
        ""
    end
  end

  defp list(instances) do
    Enum.map_join(instances, "\n", fn i ->
      "  ##{i.id} #{i.status} in #{inspect(i.queue)} at step #{inspect(i.step)}, " <>
        "state: #{inspect(i.state)}"
    end)
  end

  defp workflow_name(wf) when is_atom(wf), do: GenDurable.workflow_name(wf)
  defp workflow_name(wf), do: wf

  defp workflow(wf) when is_atom(wf) and wf not in [nil, true, false],
    do: {:ok, GenDurable.workflow_name(wf)}

  defp workflow(wf) when is_binary(wf), do: {:ok, wf}

  defp workflow(other),
    do: input(:workflow, "must be a module or a workflow name, got: #{inspect(other)}")

  defp known(opts, known) do
    if is_list(opts) and Keyword.keyword?(opts) do
      case Keyword.keys(opts) -- known do
        [] ->
          :ok

        [k | _] ->
          input(
            :options,
            "unknown option #{inspect(k)} (known: #{Enum.map_join(known, ", ", &inspect/1)})"
          )
      end
    else
      input(:options, "expected a keyword list, got: #{inspect(opts)}")
    end
  end

  defp state(nil), do: {:ok, nil}
  defp state(m) when is_map(m) and not is_struct(m), do: {:ok, m}
  defp state(other), do: input(:state, "must be a map, got: #{inspect(other)}")

  defp name(a, _field) when is_atom(a) and a not in [nil, true, false],
    do: {:ok, Atom.to_string(a)}

  defp name(s, _field) when is_binary(s), do: {:ok, s}
  defp name(other, field), do: input(field, "must be a string or an atom, got: #{inspect(other)}")

  defp opt_name(nil, _field), do: {:ok, nil}
  defp opt_name(v, field), do: name(v, field)

  defp status(nil), do: {:ok, nil}
  defp status(s) when s in @statuses, do: {:ok, Atom.to_string(s)}
  defp status(s) when is_binary(s), do: {:ok, s}

  defp status(other),
    do:
      input(
        :status,
        "expected one of #{Enum.map_join(@statuses, ", ", &inspect/1)}, got: #{inspect(other)}"
      )

  defp boolean(b, _field) when is_boolean(b), do: {:ok, b}
  defp boolean(other, field), do: input(field, "must be true or false, got: #{inspect(other)}")

  defp count(nil, _field), do: {:ok, nil}
  defp count(n, _field) when is_integer(n) and n > 0, do: {:ok, n}
  defp count(other, field), do: input(field, "must be a positive integer, got: #{inspect(other)}")

  defp input(field, why), do: {:error, Error.input(field, "invalid #{field}: #{why}")}
end

defmodule GenDurable.Options do
  @moduledoc false
  # Translates the engine's keyword options into the map the core reads
  # (`gendurable::options::EngineOptions`): keyword lists become maps with
  # string keys, at every level, and the NIF turns atoms into strings. The
  # core checks every option (its name, shape, type and value) and its
  # messages, which name the option, reach the caller unchanged.
  #
  # What is Elixir's stays here:
  #
  #   * `:name`, the name the tree is registered under;
  #   * `:workflows`, modules: each must be available and define
  #     handle_step/3. Its workflow name, the rate limits it declares
  #     (`use GenDurable, rate_limits: ...`) and its defaults (`use
  #     GenDurable, queue: ..., priority: ..., max_attempts: ..., backoff:
  #     {base, max}, timeout: ms`) and its step timeouts (`step_timeouts:
  #     %{step => ms}`) become the core's workflows, `step_rate_limits`,
  #     `workflow_defaults` and `step_timeouts`; a `{base, max}` backoff
  #     becomes `[base:, max:]` and the core checks the values;
  #   * `:cron`, a list of `{schedule, workflow, opts}` (or `{schedule,
  #     workflow}`): each becomes the core's `{"schedule", "instance",
  #     "name", "timezone", "missed"}`, the instance being the insert
  #     `GenDurable.insert(workflow, opts)` would make of the options other
  #     than `:name`, `:timezone` and `:missed`; an entry given as a map or
  #     keyword list is the core's own shape, passed on;
  #   * `:inline` is read by the NIF, which gives it to the core's builder
  #     (it is not one of the core's `EngineOptions`);
  #   * `:url` defaults to the `DATABASE_URL` variable;
  #   * a keyword list can give a name twice and a map cannot: a name given
  #     twice is refused rather than one of its values dropped;
  #   * `:shutdown_timeout` also bounds how long the supervisor waits for
  #     the engine to stop.

  alias GenDurable.Error

  @default_shutdown_timeout 15_000

  @doc false
  # {:ok, %{name: atom, config: %{options: map, workflows: [{name, module}]},
  #         shutdown_timeout: ms}} | {:error, %Error{}}
  def validate(opts) do
    with :ok <- keyword(opts),
         :ok <- no_duplicates(opts, []),
         {:ok, name} <- name(Keyword.get(opts, :name, GenDurable)),
         {:ok, workflows} <- workflows(Keyword.get(opts, :workflows, [])),
         {:ok, options} <- translate(Keyword.drop(opts, [:name, :workflows, :cron]), []),
         {:ok, options} <- cron(options, Keyword.fetch(opts, :cron)),
         {:ok, options} <- url(options) do
      options =
        options
        |> declare("step_rate_limits", for(w <- workflows, do: {w.name, w.rate_limits}))
        |> declare("step_timeouts", for(w <- workflows, do: {w.name, w.step_timeouts}))
        |> declare("workflow_defaults", for(w <- workflows, do: {w.name, w.defaults}))

      {:ok,
       %{
         name: name,
         config: %{options: options, workflows: Enum.map(workflows, &{&1.name, &1.module})},
         shutdown_timeout: shutdown_timeout(options)
       }}
    end
  end

  defp error(message), do: {:error, Error.config(message)}

  defp keyword(opts) do
    if is_list(opts) and Keyword.keyword?(opts),
      do: :ok,
      else: error("the engine options must be a keyword list, got: #{inspect(opts)}")
  end

  defp name(name) when is_atom(name) and name not in [nil, true, false], do: {:ok, name}
  defp name(other), do: error("option :name must be an atom, got: #{inspect(other)}")

  defp url(options) do
    case Map.get(options, "url") do
      nil ->
        case System.get_env("DATABASE_URL") do
          url when is_binary(url) and url != "" -> {:ok, Map.put(options, "url", url)}
          _ -> error("engine option url is required (or set DATABASE_URL)")
        end

      _ ->
        {:ok, options}
    end
  end

  defp shutdown_timeout(options) do
    case Map.get(options, "shutdown_timeout") do
      ms when is_integer(ms) and ms >= 0 -> ms
      _ -> @default_shutdown_timeout
    end
  end

  # -- Keyword lists to maps ------------------------------------------------

  # A list of {name, value} pairs (names atoms or strings) becomes a map with
  # string keys, its values translated too; so do a map's values. Anything
  # else is left for the NIF and the core to read.
  defp translate(value, path) when is_list(value) do
    if pairs?(value), do: pairs_to_map(value, path), else: {:ok, value}
  end

  defp translate(value, path) when is_map(value) and not is_struct(value) do
    Enum.reduce_while(value, {:ok, %{}}, fn {k, v}, {:ok, acc} ->
      case translate(v, path ++ [name_string(k)]) do
        {:ok, v} -> {:cont, {:ok, Map.put(acc, k, v)}}
        err -> {:halt, err}
      end
    end)
  end

  defp translate(value, _path), do: {:ok, value}

  defp pairs?(list) do
    Enum.all?(list, fn
      {k, _} -> is_binary(k) or (is_atom(k) and k not in [nil, true, false])
      _ -> false
    end)
  end

  defp pairs_to_map(pairs, path) do
    with :ok <- no_duplicates(pairs, path) do
      Enum.reduce_while(pairs, {:ok, %{}}, fn {k, v}, {:ok, acc} ->
        k = name_string(k)

        case translate(v, path ++ [k]) do
          {:ok, v} -> {:cont, {:ok, Map.put(acc, k, v)}}
          err -> {:halt, err}
        end
      end)
    end
  end

  defp no_duplicates(pairs, path) do
    names = Enum.map(pairs, fn {k, _} -> name_string(k) end)

    case names -- Enum.uniq(names) do
      [] -> :ok
      [dup | _] -> error("#{place(path)}: #{inspect(dup)} is given twice")
    end
  end

  defp name_string(k) when is_atom(k), do: Atom.to_string(k)
  defp name_string(k), do: k

  # Where an option is, worded as the core words it.
  defp place([]), do: "engine options"
  defp place(path), do: "engine option " <> Enum.map_join(Enum.with_index(path), &segment/1)

  defp segment({name, i}) when is_binary(name) do
    cond do
      not Regex.match?(~r/^[A-Za-z_][A-Za-z0-9_]*$/, name) -> "[#{inspect(name)}]"
      i == 0 -> name
      true -> "." <> name
    end
  end

  defp segment({other, _}), do: "[#{inspect(other)}]"

  # -- Cron -------------------------------------------------------------------

  @cron_entry_options [:name, :timezone, :missed]

  defp cron(options, :error), do: {:ok, options}
  defp cron(options, {:ok, nil}), do: {:ok, options}

  defp cron(options, {:ok, entries}) when is_list(entries) do
    entries
    |> Enum.with_index()
    |> Enum.reduce_while({:ok, []}, fn {entry, i}, {:ok, acc} ->
      case cron_entry(entry, ["cron", i]) do
        {:ok, e} -> {:cont, {:ok, [e | acc]}}
        err -> {:halt, err}
      end
    end)
    |> case do
      {:ok, acc} -> {:ok, Map.put(options, "cron", Enum.reverse(acc))}
      err -> err
    end
  end

  # Not a list: the core says what it expected.
  defp cron(options, {:ok, other}), do: {:ok, Map.put(options, "cron", other)}

  defp cron_entry({schedule, workflow}, path), do: cron_entry({schedule, workflow, []}, path)

  defp cron_entry({schedule, workflow, opts}, path) do
    if is_list(opts) and Keyword.keyword?(opts) do
      {entry, insert} = Keyword.split(opts, @cron_entry_options)

      with :ok <- no_duplicates(opts, path),
           :ok <- no_engine(opts, path),
           {:ok, instance} <- instance(workflow, insert, path) do
        entry = Map.new(entry, fn {k, v} -> {Atom.to_string(k), v} end)
        {:ok, Map.merge(entry, %{"schedule" => schedule, "instance" => instance})}
      end
    else
      error("#{place(path)}: the options must be a keyword list, got: #{inspect(opts)}")
    end
  end

  defp cron_entry(entry, path) when is_tuple(entry) do
    error(
      "#{place(path)}: expected {schedule, workflow} or {schedule, workflow, options}, " <>
        "got: #{inspect(entry)}"
    )
  end

  # A map or keyword list in the core's own shape.
  defp cron_entry(entry, path), do: translate(entry, path)

  # An insert's `:engine` says which engine inserts; an entry's engine is
  # the one it is given to.
  defp no_engine(opts, path) do
    if Keyword.has_key?(opts, :engine),
      do: error("#{place(path)}: :engine is not an option of a cron entry"),
      else: :ok
  end

  defp instance(workflow, opts, path) do
    case GenDurable.__instance__(workflow, opts) do
      {:ok, instance} -> {:ok, instance}
      {:error, e} -> error("#{place(path)}: #{e.message}")
    end
  end

  # -- Workflows --------------------------------------------------------------

  defp workflows(mods) when is_list(mods) do
    Enum.reduce_while(mods, {:ok, []}, fn mod, {:ok, acc} ->
      cond do
        not is_atom(mod) or mod in [nil, true, false] ->
          {:halt, error("option :workflows: #{inspect(mod)} is not a module")}

        not Code.ensure_loaded?(mod) ->
          {:halt, error("option :workflows: module #{inspect(mod)} is not available")}

        not function_exported?(mod, :handle_step, 3) ->
          {:halt,
           error(
             "option :workflows: #{inspect(mod)} does not define handle_step/3 (use GenDurable)"
           )}

        true ->
          name = GenDurable.workflow_name(mod)

          with {:ok, rate_limits} <-
                 translate(declared_rate_limits(mod), ["step_rate_limits", name]),
               {:ok, defaults} <- translate(declared_defaults(mod), ["workflow_defaults", name]) do
            w = %{
              name: name,
              module: mod,
              rate_limits: rate_limits,
              step_timeouts: declared_step_timeouts(mod),
              defaults: defaults
            }

            {:cont, {:ok, [w | acc]}}
          else
            err -> {:halt, err}
          end
      end
    end)
    |> case do
      {:ok, acc} -> {:ok, Enum.reverse(acc)}
      err -> err
    end
  end

  defp workflows(other),
    do: error("option :workflows must be a list of modules, got: #{inspect(other)}")

  # What `use GenDurable, rate_limits: %{step => key}` declared.
  defp declared_rate_limits(mod) do
    if function_exported?(mod, :__gen_durable_rate_limits__, 0),
      do: mod.__gen_durable_rate_limits__(),
      else: %{}
  end

  # What `use GenDurable, step_timeouts: %{step => ms}` declared.
  defp declared_step_timeouts(mod) do
    if function_exported?(mod, :__gen_durable_step_timeouts__, 0),
      do: mod.__gen_durable_step_timeouts__(),
      else: %{}
  end

  # What `use GenDurable, queue: ..., priority: ..., max_attempts: ...,
  # backoff: {base, max}, timeout: ms` declared, the backoff as the core reads it; the
  # core checks the values.
  defp declared_defaults(mod) do
    declared =
      if function_exported?(mod, :__gen_durable_defaults__, 0),
        do: mod.__gen_durable_defaults__(),
        else: []

    if is_list(declared) and Keyword.keyword?(declared) do
      Enum.map(declared, fn
        {:backoff, {base, max}} -> {:backoff, [base: base, max: max]}
        other -> other
      end)
    else
      declared
    end
  end

  # The workflows' declarations become the core's `step_rate_limits` (which
  # it checks against the configured rate limits) and `workflow_defaults`,
  # added to those given as engine options; a workflow's declaration wins.
  defp declare(options, option, workflows) do
    declared = for {name, d} <- workflows, d != %{}, into: %{}, do: {name, d}

    case Map.get(options, option) do
      _ when declared == %{} -> options
      nil -> Map.put(options, option, declared)
      given when is_map(given) -> Map.put(options, option, Map.merge(given, declared))
      _ -> options
    end
  end
end

defmodule GenDurable.Options do
  @moduledoc false
  # Validation of the engine's keyword options. Only shapes and types are
  # checked here; the core validates the values (names, limits, durations)
  # and its messages reach the caller unchanged.

  alias GenDurable.Error

  @known [
    :name,
    :url,
    :schema,
    :node_id,
    :queues,
    :concurrency_limits,
    :rate_limits,
    :workflows,
    :poll_interval,
    :heartbeat_interval,
    :lease,
    :shutdown_timeout,
    :gc_interval,
    :backoff,
    :retention,
    :pool_size
  ]

  @default_shutdown_timeout 15_000

  def known, do: @known

  @doc false
  # {:ok, %{name: atom, config: map, shutdown_timeout: ms}} | {:error, %Error{}}
  def validate(opts) do
    with :ok <- keyword(opts, "the engine options"),
         :ok <- no_duplicates(Keyword.keys(opts), "option"),
         :ok <- no_unknown(opts),
         {:ok, name} <- name(Keyword.get(opts, :name, GenDurable)),
         {:ok, url} <- url(Keyword.get(opts, :url)),
         {:ok, schema} <- string_or_nil(opts, :schema),
         {:ok, node_id} <- string_or_nil(opts, :node_id),
         {:ok, queues} <- queues(Keyword.get(opts, :queues, [])),
         {:ok, gates} <- gates(Keyword.get(opts, :concurrency_limits, [])),
         {:ok, rates} <- rates(Keyword.get(opts, :rate_limits, [])),
         {:ok, workflows} <- workflows(Keyword.get(opts, :workflows, []), rates),
         {:ok, durations} <-
           durations(opts, [
             :poll_interval,
             :heartbeat_interval,
             :lease,
             :shutdown_timeout,
             :gc_interval
           ]),
         {:ok, backoff} <- backoff(Keyword.get(opts, :backoff)),
         {:ok, retention} <- retention(Keyword.get(opts, :retention)),
         {:ok, pool_size} <- pos_or_nil(opts, :pool_size) do
      config =
        Map.merge(durations, %{
          url: url,
          schema: schema,
          node_id: node_id,
          queues: queues,
          gates: gates,
          rates: rates,
          workflows: workflows,
          backoff: backoff,
          retention: retention,
          pool_size: pool_size
        })

      {:ok,
       %{
         name: name,
         config: config,
         shutdown_timeout: durations.shutdown_timeout || @default_shutdown_timeout
       }}
    end
  end

  defp error(message), do: {:error, Error.config(message)}

  defp keyword(opts, what) do
    if is_list(opts) and Keyword.keyword?(opts),
      do: :ok,
      else: error("#{what} must be a keyword list, got: #{inspect(opts)}")
  end

  defp no_duplicates(names, what) do
    case names -- Enum.uniq(names) do
      [] -> :ok
      [dup | _] -> error("#{what} #{inspect(dup)} is given twice")
    end
  end

  defp no_unknown(opts) do
    case Keyword.keys(opts) -- @known do
      [] ->
        :ok

      [unknown | _] ->
        error(
          "unknown option #{inspect(unknown)}; known options: " <>
            Enum.map_join(@known, ", ", &inspect/1)
        )
    end
  end

  defp name(name) when is_atom(name) and name not in [nil, true, false], do: {:ok, name}
  defp name(other), do: error("option :name must be an atom, got: #{inspect(other)}")

  defp url(nil) do
    case System.get_env("DATABASE_URL") do
      url when is_binary(url) and url != "" -> {:ok, url}
      _ -> error("option :url is required (or set DATABASE_URL)")
    end
  end

  defp url(url) when is_binary(url) and url != "", do: {:ok, url}
  defp url(other), do: error("option :url must be a non-empty string, got: #{inspect(other)}")

  defp string_or_nil(opts, key) do
    case Keyword.get(opts, key) do
      nil -> {:ok, nil}
      s when is_binary(s) -> {:ok, s}
      other -> error("option #{inspect(key)} must be a string, got: #{inspect(other)}")
    end
  end

  defp pos_or_nil(opts, key) do
    case Keyword.get(opts, key) do
      nil -> {:ok, nil}
      n when is_integer(n) and n > 0 -> {:ok, n}
      other -> error("option #{inspect(key)} must be a positive integer, got: #{inspect(other)}")
    end
  end

  @doc false
  def key_name(n) when is_binary(n), do: {:ok, n}
  def key_name(n) when is_atom(n) and n not in [nil, true, false], do: {:ok, Atom.to_string(n)}
  def key_name(_), do: :error

  # [default: 10, mailers: 5]
  defp queues(queues) do
    named_list(queues, :queues, fn name, n ->
      if is_integer(n) and n > 0,
        do: {:ok, {name, n}},
        else:
          error(
            "queue #{inspect(name)}: concurrency must be a positive integer, got: #{inspect(n)}"
          )
    end)
  end

  # [stripe: [limit: 100, shards: 10]]
  defp gates(gates) do
    named_list(gates, :concurrency_limits, fn name, opts ->
      with {:ok, opts} <- sub(opts, "concurrency_limits #{inspect(name)}", [:limit, :shards]),
           {:ok, limit} <- sub_int(opts, :limit, "concurrency_limits #{inspect(name)}", nil),
           {:ok, shards} <- sub_int(opts, :shards, "concurrency_limits #{inspect(name)}", 1) do
        {:ok, {name, limit, shards}}
      end
    end)
  end

  # [openai: [limit: 100, period: 60_000, burst: 10]]
  defp rates(rates) do
    named_list(rates, :rate_limits, fn name, opts ->
      what = "rate_limits #{inspect(name)}"

      with {:ok, opts} <- sub(opts, what, [:limit, :period, :burst]),
           {:ok, limit} <- sub_int(opts, :limit, what, nil),
           {:ok, period} <- sub_int(opts, :period, what, nil),
           {:ok, burst} <- sub_int(opts, :burst, what, 1) do
        {:ok, {name, limit, period, burst}}
      end
    end)
  end

  defp named_list(list, key, fun) do
    with :ok <- keyword_or_pairs(list, key) do
      names = Enum.map(list, fn {n, _} -> key_name(n) end)

      cond do
        Enum.any?(names, &(&1 == :error)) ->
          error("option #{inspect(key)}: names must be atoms or strings, got: #{inspect(list)}")

        true ->
          names = Enum.map(names, fn {:ok, n} -> n end)

          with :ok <- no_duplicates(names, "#{key}: name") do
            Enum.zip(names, Enum.map(list, &elem(&1, 1)))
            |> Enum.reduce_while({:ok, []}, fn {name, v}, {:ok, acc} ->
              case fun.(name, v) do
                {:ok, x} -> {:cont, {:ok, [x | acc]}}
                err -> {:halt, err}
              end
            end)
            |> case do
              {:ok, acc} -> {:ok, Enum.reverse(acc)}
              err -> err
            end
          end
      end
    end
  end

  defp keyword_or_pairs(list, key) do
    if is_list(list) and Enum.all?(list, &match?({_, _}, &1)),
      do: :ok,
      else: error("option #{inspect(key)} must be a keyword list, got: #{inspect(list)}")
  end

  defp sub(opts, what, allowed) do
    cond do
      not (is_list(opts) and Keyword.keyword?(opts)) ->
        error("#{what} must be a keyword list such as [limit: 10], got: #{inspect(opts)}")

      (unknown = Keyword.keys(opts) -- allowed) != [] ->
        error(
          "#{what}: unknown option #{inspect(hd(unknown))}; known: " <>
            Enum.map_join(allowed, ", ", &inspect/1)
        )

      true ->
        with :ok <- no_duplicates(Keyword.keys(opts), "#{what}: option"), do: {:ok, opts}
    end
  end

  defp sub_int(opts, key, what, default) do
    case Keyword.fetch(opts, key) do
      :error when default == nil -> error("#{what}: #{inspect(key)} is required")
      :error -> {:ok, default}
      {:ok, n} when is_integer(n) and n >= 0 and n < 4_294_967_296 -> {:ok, n}
      {:ok, n} -> error("#{what}: #{inspect(key)} must be a positive integer, got: #{inspect(n)}")
    end
  end

  defp workflows(mods, rates) when is_list(mods) do
    rate_names = Enum.map(rates, &elem(&1, 0))

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

        Enum.any?(acc, fn {_, m, _} -> m == mod end) ->
          {:halt, error("option :workflows: #{inspect(mod)} is given twice")}

        true ->
          case declared_rate_limits(mod, rate_names) do
            {:ok, steps} -> {:cont, {:ok, [{GenDurable.workflow_name(mod), mod, steps} | acc]}}
            err -> {:halt, err}
          end
      end
    end)
    |> case do
      {:ok, acc} -> {:ok, Enum.reverse(acc)}
      err -> err
    end
  end

  defp workflows(other, _rates),
    do: error("option :workflows must be a list of modules, got: #{inspect(other)}")

  # The rate limits declared with `use GenDurable, rate_limits: %{step => key}`,
  # read from the function `use` generates. Every key's name must be one of
  # the engine's `:rate_limits`.
  defp declared_rate_limits(mod, rate_names) do
    declared =
      if function_exported?(mod, :__gen_durable_rate_limits__, 0),
        do: mod.__gen_durable_rate_limits__(),
        else: %{}

    case step_rate_limits(declared) do
      {:ok, steps} ->
        case Enum.find(steps, fn {_, key} -> key_prefix(key) not in rate_names end) do
          nil ->
            {:ok, steps}

          {step, key} ->
            error(
              "workflow #{inspect(mod)} declares the rate-limit key #{inspect(key)} for " <>
                "step #{inspect(step)} (use GenDurable, rate_limits: ...), but no rate limit " <>
                "named #{inspect(key_prefix(key))} is configured in option :rate_limits " <>
                "(configured: #{inspect(rate_names)})"
            )
        end

      {:error, message} ->
        error("workflow #{inspect(mod)}: #{message}")
    end
  end

  defp key_prefix(key), do: key |> String.split(":", parts: 2) |> hd()

  @doc false
  # Checks a `rate_limits: %{step => key}` declaration. Returns
  # {:ok, [{step, key}]} (sorted by step) or {:error, message}.
  def step_rate_limits(declared) when is_map(declared) and not is_struct(declared) do
    declared
    |> Enum.sort()
    |> Enum.reduce_while({:ok, []}, fn {step, key}, {:ok, acc} ->
      cond do
        not non_empty_string?(step) ->
          {:halt,
           {:error, "rate_limits: step names must be non-empty strings, got: #{inspect(step)}"}}

        not non_empty_string?(key) or String.starts_with?(key, ":") ->
          {:halt,
           {:error,
            "rate_limits: the key for step #{inspect(step)} must be a string naming a " <>
              "configured rate limit, such as \"openai:default\", got: #{inspect(key)}"}}

        true ->
          {:cont, {:ok, [{step, key} | acc]}}
      end
    end)
    |> case do
      {:ok, acc} -> {:ok, Enum.reverse(acc)}
      err -> err
    end
  end

  def step_rate_limits(other) do
    {:error,
     "rate_limits must be a map of step names to rate-limit keys, such as " <>
       "%{\"call_api\" => \"openai:default\"}, got: #{inspect(other)}"}
  end

  defp non_empty_string?(s), do: is_binary(s) and s != "" and String.valid?(s)

  defp durations(opts, keys) do
    Enum.reduce_while(keys, {:ok, %{}}, fn key, {:ok, acc} ->
      case Keyword.get(opts, key) do
        nil ->
          {:cont, {:ok, Map.put(acc, key, nil)}}

        ms when is_integer(ms) and ms > 0 ->
          {:cont, {:ok, Map.put(acc, key, ms)}}

        other ->
          {:halt,
           error(
             "option #{inspect(key)} must be a positive integer (milliseconds), got: #{inspect(other)}"
           )}
      end
    end)
  end

  defp backoff(nil), do: {:ok, nil}

  defp backoff(opts) do
    with {:ok, opts} <- sub(opts, "option :backoff", [:base, :max]),
         {:ok, base} <- sub_int(opts, :base, "option :backoff", nil),
         {:ok, max} <- sub_int(opts, :max, "option :backoff", nil) do
      {:ok, {base, max}}
    end
  end

  defp retention(nil), do: {:ok, nil}
  defp retention(:infinity), do: {:ok, 0}
  defp retention(ms) when is_integer(ms) and ms > 0, do: {:ok, ms}

  defp retention(other),
    do:
      error(
        "option :retention must be a positive integer (milliseconds) or :infinity, got: #{inspect(other)}"
      )
end

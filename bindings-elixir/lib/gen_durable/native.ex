defmodule GenDurable.Native do
  @moduledoc false
  # The NIF. Functions that touch the network or wait return at once and
  # answer later with a `{ref, result}` message (see `GenDurable.Native.await/1`).

  @on_load :load_nif

  def load_nif do
    path = :filename.join(:code.priv_dir(:gen_durable), ~c"libgendurable_nif")
    :erlang.load_nif(path, 0)
  end

  defp nif, do: :erlang.nif_error(:gen_durable_nif_not_loaded)

  def engine_new, do: nif()
  def engine_check(_options, _workflows), do: nif()
  def engine_start(_engine, _options, _workflows, _ref), do: nif()
  def engine_stop(_engine, _ref), do: nif()
  def dispatcher_register(_engine), do: nif()
  def dispatcher_close(_engine), do: nif()
  def dispatcher_wanted(_engine), do: nif()
  def dispatcher_take(_engine), do: nif()
  def runner_next(_engine, _manager), do: nif()
  def runner_exited(_engine, _pid, _reason), do: nif()
  def step_begin(_handle), do: nif()
  def step_begin_dirty(_handle), do: nif()
  def step_reply(_handle, _result), do: nif()
  def step_reply_dirty(_handle, _result), do: nif()
  def step_exited(_handle, _pid, _reason), do: nif()
  def insert_many(_engine, _news, _ref), do: nif()
  def enqueue_args(_new), do: nif()
  def get(_engine, _id, _ref), do: nif()
  def instance_term(_instance), do: nif()
  def signal(_engine, _name, _payload, _ttl, _ref), do: nif()
  def send_signal(_engine, _id, _name, _payload, _ref), do: nif()
  def signal_instance(_engine, _id, _name, _payload, _ref), do: nif()
  def cancel(_engine, _id, _reason, _ref), do: nif()
  def count(_engine, _filter, _ref), do: nif()
  def act_where(_engine, _action, _filter, _reason, _ref), do: nif()
  def act_one(_engine, _action, _id, _ref), do: nif()
  def pause_queue(_engine, _queue, _paused, _ref), do: nif()
  def paused_queues(_engine, _ref), do: nif()
  def metrics(_engine, _ref), do: nif()
  def metrics_addr(_engine, _ref), do: nif()
  def drain(_engine, _queue, _scheduled, _max_steps, _ref), do: nif()
  def inserted(_engine, _workflow, _state, _queue, _status, _limit, _ref), do: nif()
  def instances_term(_instances), do: nif()
  def temp_postgres_start(_ref), do: nif()
  def temp_postgres_stop(_pg), do: nif()
  def bulkhead_configure(_name, _limit, _reclaim_after, _wait), do: nif()
  def bulkhead_acquire(_name, _ref), do: nif()
  def bulkhead_release(_permit), do: nif()
  def bulkhead_in_flight(_name), do: nif()
  def bulkhead_limit(_name), do: nif()
  def bulkhead_reset(_name), do: nif()
  def bench_rust_noop(_url, _schema, _n, _concurrency, _ref), do: nif()
  def bench_rust_run(_url, _schema, _n, _concurrency, _ref), do: nif()
  def bench_sleep(_micros, _ref), do: nif()
  def status(_url, _schema, _keys, _gates, _connect_timeout, _ref), do: nif()
  def migrate(_url, _schema, _connect_timeout, _ref), do: nif()

  @doc false
  # Calls an asynchronous NIF and waits (in `receive`, not on a scheduler) for
  # its answer. `fun` gets the reference to answer with.
  def call(fun) do
    ref = make_ref()

    case fun.(ref) do
      :ok -> await(ref)
      {:error, _} = error -> error
    end
  end

  @doc false
  def await(ref) do
    receive do
      {^ref, result} -> result
    end
  end
end

# The application's `:telemetry`, as far as the engine uses it: handlers
# attached by event and called by `execute/3`. Defined only where the real
# package is not on the code path (it is not a dependency of this one).
unless Code.ensure_loaded?(:telemetry) do
  defmodule :telemetry do
    @moduledoc false

    def attach_many(id, events, fun, config) do
      :persistent_term.put({__MODULE__, id}, {events, fun, config})
      :ok
    end

    def detach(id), do: if(:persistent_term.erase({__MODULE__, id}), do: :ok, else: :ok)

    def execute(event, measurements, metadata) do
      for {{__MODULE__, _id}, {events, fun, config}} <- :persistent_term.get(),
          event in events do
        fun.(event, measurements, metadata, config)
      end

      :ok
    end
  end
end

defmodule GenDurableTest.Observed do
  @moduledoc false
  # Two steps; the second raises when the state says so.
  use GenDurable

  @impl true
  def handle_step("start", state, _ctx), do: {:next, "b", state}
  def handle_step("b", %{"raise" => true}, _ctx), do: raise("observed failure")
  def handle_step("b", state, _ctx), do: {:done, state}
end

defmodule GenDurable.MetricsLogsTest do
  # What the engine tells an operator: its metrics (`metrics/1`, and the
  # `:metrics_listen` listener a Prometheus scrapes), Logger warnings for
  # steps that fail or discard, and `:telemetry` events per step.
  use ExUnit.Case, async: true
  import ExUnit.CaptureLog
  import GenDurable.TestHelper

  alias GenDurable.Error
  alias GenDurableTest.{Observed, Steps}

  defp sample(text, name) do
    Enum.find_value(String.split(text, "\n"), fn line ->
      case String.split(line, " ") do
        [^name, v] -> String.to_integer(v)
        [series, v] -> if String.starts_with?(series, name <> "{"), do: String.to_integer(v)
        _ -> nil
      end
    end)
  end

  test "a started node serves its metrics on the address given" do
    e = start_engine(workflows: [Steps], metrics_listen: "127.0.0.1:0", node_id: "metrics-node")
    t = register()

    id = GenDurable.insert!(Steps, state: %{"test" => t, "mode" => "next_done"}, engine: e)
    wait_status(e, id, :completed)
    GenDurable.insert!(Steps, queue: "idle", engine: e)

    assert {:ok, "127.0.0.1:" <> port} = GenDurable.metrics_addr(engine: e)
    assert String.to_integer(port) > 0

    {:ok, _} = Application.ensure_all_started(:inets)
    url = String.to_charlist("http://127.0.0.1:#{port}/metrics")

    body =
      eventually(fn ->
        {:ok, {{_, 200, _}, headers, body}} = :httpc.request(:get, {url, []}, [], [])

        assert {~c"content-type", ~c"text/plain; version=0.0.4" ++ _} =
                 List.keyfind(headers, ~c"content-type", 0)

        body = to_string(body)
        sample(body, "gendurable_steps_completed_total") == 1 and body
      end)

    assert sample(body, "gendurable_steps_started_total") == 2
    assert body =~ ~s(gendurable_steps_started_total{node="metrics-node"} 2)
    assert body =~ "# TYPE gendurable_step_duration_seconds histogram"
    assert body =~ ~s(gendurable_step_duration_seconds_count{node="metrics-node"} 2)
    assert body =~ ~s(gendurable_instances{queue="idle",status="available"} 1)

    {:ok, {{_, 404, _}, _, _}} =
      :httpc.request(:get, {String.to_charlist("http://127.0.0.1:#{port}/"), []}, [], [])

    # The same text without the listener.
    assert {:ok, text} = GenDurable.metrics(engine: e)
    assert text =~ ~s(gendurable_instances{queue="idle",status="available"} 1)
    assert sample(text, "gendurable_steps_started_total") == 2
  end

  test "without the option there is no listener" do
    e = start_engine([])
    assert {:ok, nil} = GenDurable.metrics_addr(engine: e)
    assert {:ok, "# HELP" <> _} = GenDurable.metrics(engine: e)
    assert {:error, %Error{kind: :not_running}} = GenDurable.metrics(engine: :nope)
    assert {:error, %Error{field: :options}} = GenDurable.metrics(engine: e, node: "x")
  end

  test "a bad address is the core's to refuse" do
    assert {:error, {%Error{kind: :invalid_config, message: m}, _}} =
             start_engine_result(Keyword.delete(engine_opts(metrics_listen: "nowhere"), :url))

    assert m =~ "metrics_listen"
  end

  test "steps that fail or discard are logged" do
    e = start_engine(workflows: [Steps])

    log =
      capture_log(fn ->
        id = GenDurable.insert!(Steps, state: %{"mode" => "discard"}, engine: e)
        wait_status(e, id, :discarded)

        raised =
          GenDurable.insert!(Steps, state: %{"mode" => "raise"}, max_attempts: 1, engine: e)

        wait_status(e, raised, :discarded)
        send(self(), {:ids, id, raised})
      end)

    assert_received {:ids, id, raised}

    assert log =~
             ~s|GenDurableTest.Steps step "start" of instance #{id} failed (attempt 1 of 20): | <>
               "gateway timeout"

    assert log =~
             ~s|GenDurableTest.Steps step "start" of instance #{id} discarded the instance: | <>
               "card declined"

    assert log =~
             ~s|step "start" of instance #{raised} failed (attempt 1 of 1): bad things happened|
  end

  test "steps emit telemetry events when the application has :telemetry" do
    me = self()
    e = start_engine(workflows: [Observed])
    handler = "gd-test-#{unique()}"
    events = for name <- [:start, :stop, :exception], do: [:gen_durable, :step, name]

    :ok =
      :telemetry.attach_many(
        handler,
        events,
        fn event, measurements, meta, _ ->
          if meta.workflow == "GenDurableTest.Observed", do: send(me, {event, measurements, meta})
        end,
        nil
      )

    on_exit(fn -> :telemetry.detach(handler) end)

    id = GenDurable.insert!(Observed, engine: e)
    wait_status(e, id, :completed)

    assert_receive {[:gen_durable, :step, :start], %{system_time: _, monotonic_time: _},
                    %{id: ^id, step: "start", attempt: 1}}

    assert_receive {[:gen_durable, :step, :stop], %{duration: d},
                    %{id: ^id, step: "start", result: :next, queue: "default"}}

    assert is_integer(d) and d >= 0
    assert_receive {[:gen_durable, :step, :stop], _, %{id: ^id, step: "b", result: :done}}

    raised = GenDurable.insert!(Observed, state: %{"raise" => true}, max_attempts: 1, engine: e)
    wait_status(e, raised, :discarded)

    assert_receive {[:gen_durable, :step, :exception], %{duration: _},
                    %{id: ^raised, step: "b", kind: :error, reason: %RuntimeError{}} = meta}

    assert [_ | _] = meta.stacktrace
    refute_received {[:gen_durable, :step, :stop], _, %{id: ^raised, step: "b"}}
  end
end

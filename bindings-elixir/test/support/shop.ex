defmodule Shop do
  @moduledoc false
  # A small application, as a user of GenDurable writes one, tested with
  # GenDurable.Testing (test/testing_test.exs): an order is charged, then a
  # receipt is sent from the mailers queue. It uses the default engine.

  def place_order(order, email),
    do: GenDurable.insert(Shop.Order, state: %{order: order, email: email})
end

defmodule Shop.Order do
  @moduledoc false
  use GenDurable

  @impl true
  def handle_step("start", state, _ctx), do: {:next, "receipt", Map.put(state, "charged", true)}

  def handle_step("receipt", %{"order" => order, "email" => email} = state, _ctx) do
    {:ok, _} = GenDurable.insert(Shop.Receipt, state: %{order: order, email: email})
    {:done, state}
  end
end

defmodule Shop.Receipt do
  @moduledoc false
  use GenDurable, queue: "mailers"

  @impl true
  def handle_step("start", state, _ctx), do: {:done, Map.put(state, "sent", true)}
end

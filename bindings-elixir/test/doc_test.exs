defmodule GenDurable.DocTest do
  use ExUnit.Case, async: true
  doctest GenDurable
end

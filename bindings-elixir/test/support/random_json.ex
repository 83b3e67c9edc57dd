defmodule GenDurableTest.RandomJson do
  @moduledoc false
  # Seeded random JSON values as Elixir terms: maps with string keys, lists,
  # UTF-8 binaries, integers (64-bit, signed or not), finite floats, true,
  # false and nil. Uses the calling process's `:rand` state: call `seed/1`
  # first and the same seed gives the same values.

  # Containers nested deeper than this are refused (core/src/validate.rs).
  @max_depth 100

  def max_depth, do: @max_depth

  def seed(seed), do: :rand.seed(:exsss, {seed, seed * 7 + 1, seed * 13 + 2})

  @doc "A map of about `budget` values in all, nested at most `depth_left` deep."
  def map(budget, depth_left \\ @max_depth) do
    n = count(budget)
    share = div(budget, max(n, 1))
    Map.new(1..n//1, fn _ -> {string(), value(share, depth_left - 1)} end)
  end

  @doc "A list of about `budget` values in all."
  def list(budget, depth_left \\ @max_depth) do
    n = count(budget)
    share = div(budget, max(n, 1))
    for _ <- 1..n//1, do: value(share, depth_left - 1)
  end

  @doc "Any JSON value: a container when the budget and the depth allow."
  def value(budget, depth_left \\ @max_depth) do
    case :rand.uniform(10) do
      n when n <= 5 or budget <= 1 or depth_left <= 1 -> scalar()
      n when n <= 7 -> list(budget, depth_left)
      _ -> map(budget, depth_left)
    end
  end

  # Up to 30 children, fewer when the budget is small.
  defp count(budget), do: :rand.uniform(min(max(budget, 1), 30) + 1) - 1

  def scalar do
    case :rand.uniform(8) do
      1 -> Enum.random([nil, true, false])
      n when n in 2..3 -> integer()
      n when n in 4..5 -> float()
      _ -> string()
    end
  end

  def integer do
    case :rand.uniform(6) do
      1 -> Enum.random([0, -1, 1, -(2 ** 63), 2 ** 63 - 1, 2 ** 63, 2 ** 64 - 1])
      2 -> :rand.uniform(2 ** 64) - 1
      3 -> :rand.uniform(2 ** 63) - 2 ** 63
      _ -> :rand.uniform(2_001) - 1_001
    end
  end

  def float do
    case :rand.uniform(6) do
      1 ->
        Enum.random([0.0, 1.0, -1.5, 5.0e-324, 2.2250738585072014e-308, 1.7976931348623157e308])

      2 ->
        (:rand.uniform() - 0.5) * 1.0e6

      3 ->
        :rand.uniform(1_000_000) * 1.0

      _ ->
        (:rand.uniform() - 0.5) * :math.pow(10, :rand.uniform(600) - 300)
    end
  end

  # Letters, digits, JSON escapes, control characters (not NUL: PostgreSQL
  # refuses it), accents, CJK, right-to-left, combining marks and characters
  # outside the BMP.
  @alphabet String.graphemes(
              "abcXYZ019 _-:./\"\\\b\f\n\r\t\u0001\u001f\u007f" <>
                "éÅßø€日本語한국어עבריתالعربية\u0301\u200d😀🚀𝄞\u{10FFFF}"
            )
            |> Enum.flat_map(&String.codepoints/1)
            |> Enum.uniq()
            |> List.to_tuple()

  def string do
    case :rand.uniform(20) do
      1 -> ""
      2 -> string(:rand.uniform(5_000))
      _ -> string(:rand.uniform(12))
    end
  end

  def string(len) do
    size = tuple_size(@alphabet)
    for _ <- 1..len//1, into: "", do: elem(@alphabet, :rand.uniform(size) - 1)
  end

  @doc "`depth` containers nested in each other, alternating maps and lists, with siblings."
  def nested(depth) do
    Enum.reduce(2..depth//1, %{"leaf" => string()}, fn d, inner ->
      if rem(d, 2) == 0,
        do: [scalar(), inner, scalar()],
        else: %{(string() <> "#{d}") => inner, "s" => scalar()}
    end)
  end
end

"""Agent tasks with known answers: each a question, the function tools that hold the facts, the calls
an agent must make to find them, and the facts its final answer must state.

The facts are made up (a fictional employee's office, a document's launch date, a stock price), so a
model cannot answer from memory: only a run that called the right tools with the right arguments and
read their results can pass. Tools are plain typed functions with docstrings, which every agent SDK
turns into a function tool its own way (``loadtests.agent_sdks``); a ``ToolLog`` wraps them to record
each call. Used by ``loadtests/agent_tasks.py`` (the eval over every task) and
``tests/test_e2e_agent_tasks.py`` (a few per SDK and API, in CI).
"""

from __future__ import annotations

import functools
import inspect
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

INSTRUCTIONS = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant. Answer in one short sentence."

WEATHER = {
    "lisbon": {"temperature_c": 14, "sky": "light rain"},
    "oslo": {"temperature_c": -3, "sky": "snow"},
    "cairo": {"temperature_c": 31, "sky": "sunny"},
}
EMPLOYEES = {"dana whitfield": {"office": "B-312", "team": "Payments", "manager": "Ilse Marquardt"}}
ORDERS = {"A-1043": {"status": "shipped", "carrier": "DHL", "tracking_number": "JD0148"}}
DOCS = {
    "doc-4": "Falcon budget: the Falcon project's budget for 2031 is 4.2 million euros.",
    "doc-17": "Falcon launch plan: the Falcon project launches on 12 March 2031 from Site 9.",
    "doc-23": "Heron retrospective: the Heron project shipped in 2029.",
}
CAPITALS = {"valdoria": "Ostrava Nova"}
POPULATIONS = {"ostrava nova": 1284000}
PRICES = {"ACME": 187.42, "GLOBEX": 54.1}
EUR_RATES = {"JPY": 165.0, "USD": 1.08}
LOCAL_TIMES = {"tokyo": "14:05", "lima": "00:05"}


def get_weather(city: str) -> str:
    """Current weather in a city.

    Args:
        city: The city's name, e.g. Paris.
    """
    found = WEATHER.get(city.strip().lower())
    return json.dumps({"city": city, **found} if found else {"error": f"no weather for {city}"})


def add(a: float, b: float) -> str:
    """Add two numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return json.dumps({"result": _number(a + b)})


def multiply(a: float, b: float) -> str:
    """Multiply two numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return json.dumps({"result": _number(a * b)})


def celsius_to_fahrenheit(celsius: float) -> str:
    """Convert a temperature from degrees Celsius to degrees Fahrenheit.

    Args:
        celsius: The temperature in degrees Celsius.
    """
    return json.dumps({"fahrenheit": round(celsius * 9 / 5 + 32, 1)})


def lookup_employee(name: str) -> str:
    """Look up an employee in the company directory: office, team and manager.

    Args:
        name: The employee's full name.
    """
    found = EMPLOYEES.get(name.strip().lower())
    return json.dumps({"name": name, **found} if found else {"error": f"no employee named {name}"})


def get_order_status(order_id: str) -> str:
    """The shipping status of an order.

    Args:
        order_id: The order's id, e.g. A-1000.
    """
    found = ORDERS.get(order_id.strip().upper())
    return json.dumps({"order_id": order_id, **found} if found else {"error": f"no order {order_id}"})


def search_docs(query: str) -> str:
    """Search the company's documents. Returns the id and title of each match; read_doc reads one.

    Args:
        query: Words to search for.
    """
    words = {word for word in re.findall(r"[a-z0-9]+", query.lower()) if len(word) > 2}
    hits = [{"id": doc_id, "title": text.split(":")[0]} for doc_id, text in DOCS.items()
            if words & set(re.findall(r"[a-z0-9]+", text.lower()))]  # fmt: skip
    return json.dumps({"results": hits})


def read_doc(doc_id: str) -> str:
    """Read a document's full text by its id (from search_docs).

    Args:
        doc_id: The document's id, e.g. doc-1.
    """
    text = DOCS.get(doc_id.strip().lower())
    return json.dumps({"id": doc_id, "text": text} if text else {"error": f"no document {doc_id}"})


def get_capital(country: str) -> str:
    """The capital city of a country.

    Args:
        country: The country's name.
    """
    found = CAPITALS.get(country.strip().lower())
    return json.dumps({"country": country, "capital": found} if found else {"error": f"unknown country {country}"})


def get_population(city: str) -> str:
    """The population of a city.

    Args:
        city: The city's name.
    """
    found = POPULATIONS.get(city.strip().lower())
    return json.dumps({"city": city, "population": found} if found else {"error": f"unknown city {city}"})


def get_stock_price(ticker: str) -> str:
    """The latest price of a stock in US dollars.

    Args:
        ticker: The stock's ticker symbol, e.g. MSFT.
    """
    found = PRICES.get(ticker.strip().upper())
    return json.dumps({"ticker": ticker, "price_usd": found} if found else {"error": f"unknown ticker {ticker}"})


def convert_currency(amount: float, from_currency: str, to_currency: str) -> str:
    """Convert an amount of money between currencies at today's rate.

    Args:
        amount: The amount to convert.
        from_currency: The currency's ISO code, e.g. EUR.
        to_currency: The target currency's ISO code, e.g. USD.
    """
    source, target = from_currency.strip().upper(), to_currency.strip().upper()
    if source != "EUR" or target not in EUR_RATES:
        return json.dumps({"error": f"no rate from {source} to {target}"})
    return json.dumps({"amount": _number(amount * EUR_RATES[target]), "currency": target})


def get_local_time(city: str) -> str:
    """The current local time in a city (24-hour clock).

    Args:
        city: The city's name.
    """
    found = LOCAL_TIMES.get(city.strip().lower())
    return json.dumps({"city": city, "time": found} if found else {"error": f"unknown city {city}"})


def _number(value: float) -> float | int:
    return int(value) if float(value).is_integer() else round(value, 4)


@dataclass(frozen=True)
class Call:
    """A call the agent must make: the tool's name and the arguments that must match (others are free)."""

    name: str
    args: dict[str, Any] = field(default_factory=dict)

    def matches(self, name: str, args: dict[str, Any]) -> bool:
        return name == self.name and all(_same(args.get(key), want) for key, want in self.args.items())


@dataclass(frozen=True)
class Task:
    """One agent task: the question, its tools, the calls it needs and the facts its answer must state."""

    name: str
    kind: str  # weather, arithmetic, lookup, search
    question: str
    tools: tuple[Callable[..., str], ...]
    calls: tuple[Call, ...]
    facts: tuple[str, ...]

    def check(self, answer: str | None, made: list[tuple[str, dict[str, Any]]]) -> list[str]:
        """What the run got wrong (empty when it passed): each missing call, each fact not in the answer."""
        problems = [f"no call {call.name}({call.args})" for call in self.calls
                    if not any(call.matches(name, args) for name, args in made)]  # fmt: skip
        text = _normalized(answer or "")
        problems += [f"answer lacks {fact!r}" for fact in self.facts if _normalized(fact) not in text]
        return problems


TASKS: tuple[Task, ...] = (
    Task("weather", "weather", "What is the weather in Lisbon right now?", (get_weather,),
         (Call("get_weather", {"city": "Lisbon"}),), ("14",)),
    Task("weather_compare", "weather", "Is it warmer in Oslo or in Cairo right now?", (get_weather,),
         (Call("get_weather", {"city": "Oslo"}), Call("get_weather", {"city": "Cairo"})), ("Cairo",)),
    Task("weather_fahrenheit", "weather", "What is the temperature in Lisbon right now, in degrees Fahrenheit?",
         (get_weather, celsius_to_fahrenheit),
         (Call("get_weather", {"city": "Lisbon"}), Call("celsius_to_fahrenheit", {"celsius": 14})), ("57.2",)),
    Task("multiply", "arithmetic", "What is 1234 multiplied by 5678? Use the tools.", (add, multiply),
         (Call("multiply", {"a": 1234, "b": 5678}),), ("7006652",)),
    Task("add_then_multiply", "arithmetic", "Use the tools to compute (17 + 25) * 3.", (add, multiply),
         (Call("add", {"a": 17, "b": 25}), Call("multiply", {"a": 42, "b": 3})), ("126",)),
    Task("currency", "arithmetic", "How many Japanese yen is 250 euros today?", (convert_currency,),
         (Call("convert_currency", {"amount": 250, "from_currency": "EUR", "to_currency": "JPY"}),), ("41250",)),
    Task("employee_office", "lookup", "Which office is Dana Whitfield in?", (lookup_employee,),
         (Call("lookup_employee", {"name": "Dana Whitfield"}),), ("B-312",)),
    Task("order_tracking", "lookup", "What is the tracking number of order A-1043?", (get_order_status,),
         (Call("get_order_status", {"order_id": "A-1043"}),), ("JD0148",)),
    Task("stock_price", "lookup", "What is the latest price of ACME stock?", (get_stock_price,),
         (Call("get_stock_price", {"ticker": "ACME"}),), ("187.42",)),
    Task("capital_population", "lookup", "What is the population of the capital of Valdoria?",
         (get_capital, get_population),
         (Call("get_capital", {"country": "Valdoria"}), Call("get_population", {"city": "Ostrava Nova"})),
         ("1284000",)),
    Task("search_launch", "search", "When does the Falcon project launch? Search the documents and read the right one.",
         (search_docs, read_doc), (Call("search_docs"), Call("read_doc", {"doc_id": "doc-17"})), ("2031", "March")),
    Task("search_budget", "search", "What is the Falcon project's budget? Search the documents and read the right one.",
         (search_docs, read_doc), (Call("search_docs"), Call("read_doc", {"doc_id": "doc-4"})), ("4.2",)),
)  # fmt: skip

BY_NAME = {task.name: task for task in TASKS}


class ToolLog:
    """The calls one run made, in order; ``wrap`` gives each tool a recording twin with its signature."""

    def __init__(self) -> None:
        self.made: list[tuple[str, dict[str, Any]]] = []

    def wrap(self, tool: Callable[..., str]) -> Callable[..., str]:
        signature = inspect.signature(tool)

        @functools.wraps(tool)
        def recorded(*args: Any, **kwargs: Any) -> str:  # noqa: ANN401
            self.made.append((tool.__name__, dict(signature.bind(*args, **kwargs).arguments)))
            return tool(*args, **kwargs)

        return recorded


def _same(got: Any, want: Any) -> bool:  # noqa: ANN401
    if isinstance(want, str):
        return isinstance(got, str) and got.strip().lower() == want.lower()
    try:
        return float(got) == float(want)
    except (TypeError, ValueError):
        return False


def _normalized(text: str) -> str:
    """Lower case, thousands separators dropped (``7,006,652`` reads as ``7006652``)."""
    return re.sub(r"(?<=\d)[,\u202f ](?=\d{3}\b)", "", text).lower()

"""Tools and the question the structured-output API tests ask with them."""

from __future__ import annotations

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Current time in a timezone",
    "parameters": {"type": "object",
                   "properties": {"tz": {"type": "string", "pattern": "^[A-Z][a-z]{1,14}/[A-Z][a-z]{1,14}$"}},
                   "required": ["tz"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]

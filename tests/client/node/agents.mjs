// The OpenAI Agents SDK for JavaScript: an agent with a function tool on its default model (Responses).
import { Agent, run, setDefaultOpenAIClient, setTracingDisabled, tool } from "@openai/agents";
import OpenAI from "openai";
import { z } from "zod";

setTracingDisabled(true);
setDefaultOpenAIClient(new OpenAI({ baseURL: process.env.EZAT_BASE_URL, apiKey: process.env.EZAT_API_KEY, maxRetries: 0 }));
const called = [];
const getWeather = tool({
  name: "get_weather",
  description: "The current weather in a city",
  parameters: z.object({ city: z.string() }),
  execute: async ({ city }) => {
    called.push(city);
    return `sunny in ${city}`;
  },
});
const agent = new Agent({
  name: "weather",
  instructions: "Answer with the tool.",
  model: "anthropic/claude-sonnet-5-5",
  tools: [getWeather],
});
const result = await run(agent, "What is the weather in Oslo? Use the tool.");
console.log(JSON.stringify({ called, output: result.finalOutput }));

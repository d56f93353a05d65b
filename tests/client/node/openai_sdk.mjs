// The openai npm SDK on the Responses endpoint: create, stream, a function-tool loop.
import OpenAI from "openai";

const client = new OpenAI({ baseURL: process.env.EZAT_BASE_URL, apiKey: process.env.EZAT_API_KEY, maxRetries: 0 });
const model = "anthropic/claude-sonnet-5-5";
const out = {};

const created = await client.responses.create({ model, input: "What is a prompt cache?", max_output_tokens: 64 });
out.create = { id: created.id, status: created.status, text: created.output_text, total: created.usage.total_tokens };

const stream = client.responses.stream({ model, input: "Count to five", max_output_tokens: 64 });
let deltas = "";
for await (const event of stream) if (event.type === "response.output_text.delta") deltas += event.delta;
const final = await stream.finalResponse();
out.stream = { deltas, text: final.output_text, status: final.status };

const tools = [
  {
    type: "function",
    name: "get_weather",
    description: "Current weather for a city",
    parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"], additionalProperties: false },
    strict: true,
  },
];
let input = [{ role: "user", content: "Weather in Oslo? Use the tool." }];
let reply = await client.responses.create({ model, input, tools, reasoning: { effort: "high" } });
const calls = reply.output.filter((item) => item.type === "function_call");
input = [...input, ...reply.output, ...calls.map((c) => ({ type: "function_call_output", call_id: c.call_id, output: "sunny" }))];
reply = await client.responses.create({ model, input, tools, reasoning: { effort: "high" } });
out.loop = { calls: calls.map((c) => [c.name, JSON.parse(c.arguments)]), text: reply.output_text };
console.log(JSON.stringify(out));

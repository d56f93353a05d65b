// The AI SDK's default openai(model) provider (the Responses API): generateText with a tool and
// stopWhen, streamText, generateObject.
import { createOpenAI } from "@ai-sdk/openai";
import { generateObject, generateText, stepCountIs, streamText, tool } from "ai";
import { z } from "zod";

const openai = createOpenAI({ baseURL: process.env.EZAT_BASE_URL, apiKey: process.env.EZAT_API_KEY });
const model = openai("anthropic/claude-sonnet-5-5");
const out = {};

const called = [];
const generated = await generateText({
  model,
  prompt: "What is the weather in Oslo? Use the tool.",
  tools: {
    getWeather: tool({
      description: "The current weather in a city",
      inputSchema: z.object({ city: z.string() }),
      execute: async ({ city }) => {
        called.push(city);
        return `sunny in ${city}`;
      },
    }),
  },
  stopWhen: stepCountIs(3),
  maxRetries: 0,
});
out.generateText = { called, steps: generated.steps.length, text: generated.text };

const streamed = streamText({ model, prompt: "Count to five", maxRetries: 0 });
let text = "";
for await (const piece of streamed.textStream) text += piece;
out.streamText = { text, finishReason: await streamed.finishReason };

const object = await generateObject({
  model,
  schema: z.object({ city: z.string(), degrees: z.number() }),
  prompt: "The weather in Oslo as JSON",
  maxRetries: 0,
});
out.generateObject = object.object;
console.log(JSON.stringify(out));

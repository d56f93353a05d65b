// The AI SDK's generateObject through @ai-sdk/openai's chat completions provider, with a zod
// schema (the SDK sends it as a JSON schema with "$schema"). Prints the object and the usage.
import { createOpenAI } from "@ai-sdk/openai";
import { generateObject } from "ai";
import { z } from "zod";

const provider = createOpenAI({ baseURL: process.env.EZAT_BASE_URL, apiKey: process.env.EZAT_API_KEY });
const schema = z.object({
  city: z.string().min(1).describe("The city's name"),
  forecast: z
    .array(z.object({ day: z.string(), highC: z.number().int().min(-90).max(60), sky: z.enum(["clear", "rain"]) }))
    .min(1),
  alert: z.string().nullable(),
});
const { object, usage, finishReason } = await generateObject({
  model: provider.chat(process.env.EZAT_MODEL),
  schema,
  schemaName: "weather",
  prompt: "The weather in Oslo for two days.",
  maxOutputTokens: 400,
  maxRetries: 0,
});
console.log(JSON.stringify({ object, usage, finishReason }));

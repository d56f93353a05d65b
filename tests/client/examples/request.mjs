import OpenAI from "openai";

const client = new OpenAI({ baseURL: "https://api.router.ezat.io/openai/v1", apiKey: process.env.EZAT_API_KEY });

const completion = await client.chat.completions.create({
  model: "anthropic/claude-sonnet-5-5",
  max_completion_tokens: 64,
  messages: [
    { role: "system", content: "Answer in one sentence." },
    { role: "user", content: "What is a prompt cache?" },
  ],
});
console.log(completion.choices[0].message.content);
console.log(completion.choices[0].finish_reason, completion.usage);

import { defineConfig } from "vitest/config";

// The app shell (src-tauri) loads ui/dist; `npm run ui:dev` serves on a fixed port.
export default defineConfig({
  root: __dirname,
  build: { outDir: "dist", emptyOutDir: true },
  server: { port: 5178, strictPort: true },
  clearScreen: false,
  cacheDir: "../node_modules/.vite",
  test: { environment: "jsdom", include: ["src/**/*.test.ts"] },
});

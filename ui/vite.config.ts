import { defineConfig } from "vite";

// The app shell (src-tauri) loads ui/dist; `npm run ui:dev` serves on a fixed port.
export default defineConfig({
  root: __dirname,
  build: { outDir: "dist", emptyOutDir: true },
  server: { port: 5178, strictPort: true },
  clearScreen: false,
});

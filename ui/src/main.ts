// The web UI's entry: a tab bar over the app's four views. The views are
// filled in as the engine's features land (chat, models, metrics, settings).

const views = ["Chat", "Models", "Metrics", "Settings"] as const;
type View = (typeof views)[number];

function render(root: HTMLElement, current: View): void {
  root.replaceChildren();
  const nav = document.createElement("nav");
  nav.setAttribute("role", "tablist");
  for (const view of views) {
    const tab = document.createElement("button");
    tab.textContent = view;
    tab.setAttribute("role", "tab");
    tab.setAttribute("aria-selected", String(view === current));
    tab.addEventListener("click", () => render(root, view));
    nav.append(tab);
  }
  const main = document.createElement("main");
  main.setAttribute("role", "tabpanel");
  main.dataset.view = current.toLowerCase();
  const title = document.createElement("h1");
  title.textContent = current;
  main.append(title);
  root.append(nav, main);
}

const root = document.getElementById("app");
if (root) {
  render(root, "Chat");
}
